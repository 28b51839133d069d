//! The few X.509 facts the hub needs, read with a minimal DER walk: a verified client
//! certificate's subject CN (the user) and O values (the groups), as kube-apiserver reads
//! them, and a certificate's validity period.

/// The `index`-th field of tbsCertificate, counting from the serial number (0), so
/// 2 = issuer, 3 = validity, 4 = subject, whether or not the optional version is present.
fn tbs_field(der: &[u8], index: usize) -> Option<&[u8]> {
    // Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version?, serial, sigAlg,
    //                 issuer, validity, subject, ... } ... }
    let (_, cert, _) = tlv(der)?;
    let (_, mut tbs, _) = tlv(cert)?;
    let mut skip_version = true;
    let mut i = 0;
    while !tbs.is_empty() {
        let (tag, value, rest) = tlv(tbs)?;
        tbs = rest;
        if std::mem::take(&mut skip_version) && tag == 0xa0 {
            continue;
        }
        if i == index {
            return Some(value);
        }
        i += 1;
    }
    None
}

/// (CN, [O...]) of a DER certificate's subject.
pub fn subject_cn_and_orgs(der: &[u8]) -> Option<(String, Vec<String>)> {
    let subject = tbs_field(der, 4)?;
    let (mut cn, mut orgs) = (String::new(), Vec::new());
    let mut rdns = subject;
    while !rdns.is_empty() {
        let (_, set, rest) = tlv(rdns)?;
        rdns = rest;
        let mut atvs = set;
        while !atvs.is_empty() {
            let (_, atv, more) = tlv(atvs)?;
            atvs = more;
            let (_, oid, after) = tlv(atv)?;
            let (_, value, _) = tlv(after)?;
            let text = String::from_utf8_lossy(value).into_owned();
            match oid {
                [0x55, 0x04, 0x03] => cn = text,
                [0x55, 0x04, 0x0a] => orgs.push(text),
                _ => {}
            }
        }
    }
    Some((cn, orgs))
}

/// (notBefore, notAfter) of a DER certificate, as Unix seconds.
pub fn validity(der: &[u8]) -> Option<(u64, u64)> {
    let (t1, v1, rest) = tlv(tbs_field(der, 3)?)?;
    let (t2, v2, _) = tlv(rest)?;
    Some((der_time(t1, v1)?, der_time(t2, v2)?))
}

/// An RFC 3339 time as Kubernetes writes it (`2026-12-03T10:00:00Z`, fractions allowed)
/// to Unix seconds.
pub fn rfc3339_to_unix(s: &str) -> Option<u64> {
    let s = s.strip_suffix('Z')?;
    let whole = s.split('.').next()?;
    let digits: String = whole.chars().filter(char::is_ascii_digit).collect();
    if digits.len() != 14 || whole.len() != 19 {
        return None;
    }
    der_time(0x18, format!("{digits}Z").as_bytes())
}

/// Unix seconds to RFC 3339 in UTC (`2026-12-03T10:00:00Z`).
pub fn unix_to_rfc3339(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // civil_from_days (Howard Hinnant)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// UTCTime (YYMMDDHHMMSSZ) or GeneralizedTime (YYYYMMDDHHMMSSZ) to Unix seconds.
fn der_time(tag: u8, v: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(v).ok()?.strip_suffix('Z')?;
    let (year, rest) = match tag {
        0x17 => {
            let yy: i64 = s.get(0..2)?.parse().ok()?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, s.get(2..)?)
        }
        0x18 => (s.get(0..4)?.parse().ok()?, s.get(4..)?),
        _ => return None,
    };
    let n = |r: std::ops::Range<usize>| rest.get(r)?.parse::<i64>().ok();
    let (m, d) = (n(0..2)?, n(2..4)?);
    // days_from_civil (Howard Hinnant)
    let y = if m <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let secs = days * 86400 + n(4..6)? * 3600 + n(6..8)? * 60 + n(8..10)?;
    u64::try_from(secs).ok()
}

/// One DER tag-length-value: (tag, value, remaining input).
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *input.first()?;
    let first = *input.get(1)? as usize;
    let (len, header) = if first < 0x80 {
        (first, 2)
    } else {
        let n = first & 0x7f;
        if n == 0 || n > 4 {
            return None;
        }
        let mut len = 0usize;
        for i in 0..n {
            len = (len << 8) | *input.get(2 + i)? as usize;
        }
        (len, 2 + n)
    };
    let end = header.checked_add(len)?;
    Some((tag, input.get(header..end)?, input.get(end..)?))
}

#[cfg(test)]
mod tests {
    #[test]
    fn der_times() {
        assert_eq!(super::der_time(0x17, b"700101000000Z"), Some(0));
        assert_eq!(
            super::der_time(0x18, b"20261130005320Z"),
            Some(1_796_000_000)
        );
        assert_eq!(super::der_time(0x17, b"261130005320Z"), Some(1_796_000_000));
        assert_eq!(super::der_time(0x17, b"bogus"), None);
    }

    #[test]
    fn unix_times_round_trip_through_rfc3339() {
        for secs in [0, 951_782_400, 1_796_000_000, 4_102_444_799] {
            let text = super::unix_to_rfc3339(secs);
            assert_eq!(super::rfc3339_to_unix(&text), Some(secs as u64), "{text}");
        }
        assert_eq!(super::unix_to_rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn garbage_is_none_not_a_panic() {
        assert_eq!(super::subject_cn_and_orgs(&[]), None);
        assert_eq!(
            super::subject_cn_and_orgs(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]),
            None
        );
        assert_eq!(super::subject_cn_and_orgs(&[0x30, 0x03, 0x30, 0x01]), None);
    }
}
