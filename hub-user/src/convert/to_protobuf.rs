//! JSON to Kubernetes protobuf, walking the schema table. What JSON leaves out is left out of
//! the message too: Go's decoder reads an absent field as its zero, as it reads Go's own
//! encoding of that zero.

use super::schema::{Card, Field, INLINE, Message, Type};
use super::{ConvertError, message};
use crate::kproto::{put_bytes, put_uint};
use base64::Engine;
use serde_json::{Map, Value};

/// The fields of `msg` from the members of a JSON object.
pub(super) fn encode_members(
    msg: &'static Message,
    obj: &Map<String, Value>,
) -> Result<Vec<u8>, ConvertError> {
    let mut out = Vec::new();
    let mut used = 0usize;
    for field in msg.fields {
        if field.flags & INLINE != 0 {
            let Type::Message(m) = field.ty else { continue };
            let inner = message(m);
            let (bytes, n) = inline_members(inner, obj)?;
            used += n;
            if n > 0 {
                put_bytes(&mut out, field.tag.into(), &bytes);
            }
            continue;
        }
        let Some(v) = obj.get(field.json) else {
            continue;
        };
        used += 1;
        encode_field(msg, field, v, &mut out)?;
    }
    // Members this schema does not know (a newer Kubernetes' fields) are left out, counted;
    // an object's kind and apiVersion (its TypeMeta, also on list items kubectl wrote) are
    // the envelope's, not the message's.
    if used < obj.len() {
        for k in obj.keys() {
            if !known(msg, k) && k != "kind" && k != "apiVersion" {
                super::unknown_json_field(msg, k);
            }
        }
    }
    Ok(out)
}

/// The members of `obj` that belong to an inlined struct, encoded; and how many there were.
fn inline_members(
    inner: &'static Message,
    obj: &Map<String, Value>,
) -> Result<(Vec<u8>, usize), ConvertError> {
    let mine: Map<String, Value> = obj
        .iter()
        .filter(|(k, _)| known(inner, k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let n = mine.len();
    Ok((encode_members(inner, &mine)?, n))
}

/// Whether `name` is a member of `msg`'s JSON object, its inlined structs' included.
fn known(msg: &'static Message, name: &str) -> bool {
    msg.fields.iter().any(|f| {
        if f.flags & INLINE != 0 {
            matches!(f.ty, Type::Message(m) if known(message(m), name))
        } else {
            f.json == name
        }
    })
}

fn encode_field(
    msg: &'static Message,
    field: &Field,
    v: &Value,
    out: &mut Vec<u8>,
) -> Result<(), ConvertError> {
    let tag = u64::from(field.tag);
    match (field.card, v) {
        // Absent in Go's decoding, as on the wire; a zero Time alone is an empty message.
        (Card::One, Value::Null) => {
            if matches!(field.ty, Type::Time | Type::MicroTime) {
                put_bytes(out, tag, b"");
            }
        }
        (_, Value::Null) => {}
        (Card::One, v) => encode_value(msg, field, v, out)?,
        (Card::Repeated, Value::Array(items)) => {
            for item in items {
                encode_value(msg, field, item, out)?;
            }
        }
        (Card::Map, Value::Object(entries)) => {
            for (k, val) in entries {
                let mut entry = Vec::new();
                put_bytes(&mut entry, 1, k.as_bytes());
                match val {
                    // Go reads a null map value as the type's zero, and writes a zero
                    // Time as an empty message.
                    Value::Null if matches!(field.ty, Type::Time | Type::MicroTime) => {
                        put_bytes(&mut entry, 2, b"")
                    }
                    Value::Null => {}
                    val => encode_value(msg, &Field { tag: 2, ..*field }, val, &mut entry)?,
                }
                put_bytes(out, tag, &entry);
            }
        }
        _ => return Err(wrong(msg, field)),
    }
    Ok(())
}

fn encode_value(
    msg: &'static Message,
    field: &Field,
    v: &Value,
    out: &mut Vec<u8>,
) -> Result<(), ConvertError> {
    let tag = u64::from(field.tag);
    let bad = || wrong(msg, field);
    match (field.ty, v) {
        (Type::String, Value::String(s)) => put_bytes(out, tag, s.as_bytes()),
        (Type::Bool, Value::Bool(b)) => put_uint(out, tag, u64::from(*b)),
        (Type::Int32 | Type::Int64, Value::Number(n)) => {
            let i = n.as_i64().ok_or_else(bad)?;
            put_uint(out, tag, i as u64);
        }
        (Type::Bytes, Value::String(s)) => {
            let b = base64::engine::general_purpose::STANDARD
                .decode(s)
                .map_err(|_| bad())?;
            put_bytes(out, tag, &b);
        }
        (Type::Message(m), v) => {
            let inner = message(m);
            let bytes = if inner.items_only {
                let mut b = Vec::new();
                encode_field(inner, &inner.fields[0], v, &mut b)?;
                b
            } else {
                let Value::Object(obj) = v else {
                    return Err(bad());
                };
                encode_members(inner, obj)?
            };
            put_bytes(out, tag, &bytes);
        }
        (Type::Time | Type::MicroTime, Value::String(s)) => {
            let (secs, nanos) = parse_rfc3339(s).ok_or_else(bad)?;
            let mut t = Vec::new();
            put_uint(&mut t, 1, secs as u64);
            put_uint(&mut t, 2, u64::from(nanos));
            put_bytes(out, tag, &t);
        }
        (Type::Quantity, Value::String(s)) => {
            let mut q = Vec::new();
            put_bytes(&mut q, 1, s.as_bytes());
            put_bytes(out, tag, &q);
        }
        (Type::Quantity, Value::Number(n)) => {
            let mut q = Vec::new();
            put_bytes(&mut q, 1, n.to_string().as_bytes());
            put_bytes(out, tag, &q);
        }
        (Type::IntOrString, Value::Number(n)) => {
            let mut x = Vec::new();
            put_uint(&mut x, 1, 0);
            put_uint(&mut x, 2, n.as_i64().ok_or_else(bad)? as u64);
            put_bytes(&mut x, 3, b"");
            put_bytes(out, tag, &x);
        }
        (Type::IntOrString, Value::String(s)) => {
            let mut x = Vec::new();
            put_uint(&mut x, 1, 1);
            put_uint(&mut x, 2, 0);
            put_bytes(&mut x, 3, s.as_bytes());
            put_bytes(out, tag, &x);
        }
        (Type::RawJson, v) => {
            let mut r = Vec::new();
            put_bytes(&mut r, 1, v.to_string().as_bytes());
            put_bytes(out, tag, &r);
        }
        _ => return Err(bad()),
    }
    Ok(())
}

fn wrong(msg: &Message, field: &Field) -> ConvertError {
    ConvertError::Malformed(format!(
        "{}: {} does not have the type its schema gives",
        msg.name, field.json
    ))
}

/// RFC 3339 (`2024-05-01T10:00:00Z`, `...00.123456Z`, `...+02:00`) -> Unix seconds, nanos.
pub(super) fn parse_rfc3339(s: &str) -> Option<(i64, u32)> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &s[19..];
    let mut nanos = 0u32;
    if let Some(f) = rest.strip_prefix('.') {
        let digits = f.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 9 {
            return None;
        }
        nanos = f[..digits].parse::<u32>().ok()? * 10u32.pow(9 - digits as u32);
        rest = &f[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let (oh, om) = (
                rest.get(1..3)?.parse::<i64>().ok()?,
                rest.get(4..6)?.parse::<i64>().ok()?,
            );
            if rest.len() != 6 {
                return None;
            }
            sign * (oh * 3600 + om * 60)
        }
    };
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    Some((
        days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec - offset,
        nanos,
    ))
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}
