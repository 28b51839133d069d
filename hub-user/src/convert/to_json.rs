//! Kubernetes protobuf to JSON, walking the schema table: the JSON kube-apiserver itself
//! writes for the same object, key order aside.

use super::schema::{
    Card, DROP_ZERO, EMPTY_LIST, Field, INLINE, Message, NULL_IF_ABSENT, OMITZERO, Type,
};
use super::{ConvertError, Style, message};
use crate::kproto::{self, Value};
use base64::Engine;

/// Writes one JSON object member by member, for the inlined structs to share.
pub(super) struct Object<'a> {
    out: &'a mut String,
    empty: bool,
}

impl<'a> Object<'a> {
    pub(super) fn open(out: &'a mut String) -> Self {
        out.push('{');
        Object { out, empty: true }
    }

    pub(super) fn key(&mut self, name: &str) -> &mut String {
        if !self.empty {
            self.out.push(',');
        }
        self.empty = false;
        write_str(self.out, name);
        self.out.push(':');
        self.out
    }

    pub(super) fn close(self) {
        self.out.push('}');
    }
}

pub(super) fn write_str(out: &mut String, s: &str) {
    // serde_json's escaping of a &str into a String cannot fail.
    out.push_str(&serde_json::to_string(s).unwrap_or_default());
}

/// The fields of `msg` (wire bytes `buf`) as members of `obj`.
pub(super) fn members(
    msg: &'static Message,
    buf: &[u8],
    obj: &mut Object<'_>,
    style: Style,
) -> Result<(), ConvertError> {
    let wire = kproto::fields(buf).ok_or_else(|| malformed(msg, "not a protobuf message"))?;
    for (tag, _) in &wire {
        if msg.field_by_tag(*tag).is_none() {
            super::unknown_field(msg, *tag);
        }
    }
    for field in msg.fields {
        let values = || tagged(&wire, field.tag);
        if field.flags & INLINE != 0 {
            if let (Some(Value::Bytes(b)), Type::Message(m)) = (values().next_back(), field.ty) {
                members(message(m), b, obj, style)?;
            }
            continue;
        }
        match field.card {
            Card::One => {
                let Some(v) = values().next_back() else {
                    if field.flags & NULL_IF_ABSENT != 0 {
                        obj.key(field.json).push_str("null");
                    }
                    continue;
                };
                if field.flags & DROP_ZERO != 0 && is_zero(v) {
                    continue;
                }
                if field.flags & OMITZERO != 0 && style.omit_zero_structs && is_zero(v) {
                    continue;
                }
                let out = obj.key(field.json);
                value(msg, field, v, out, style)?;
            }
            Card::Repeated | Card::Map => {
                let mut any = values().peekable();
                if any.peek().is_none() {
                    if field.flags & NULL_IF_ABSENT != 0 {
                        obj.key(field.json).push_str("null");
                    } else if field.flags & EMPTY_LIST != 0 {
                        obj.key(field.json).push_str("[]");
                    }
                    continue;
                }
                let out = obj.key(field.json);
                if field.card == Card::Map {
                    map(msg, field, any, out, style)?;
                } else {
                    array(msg, field, any, out, style)?;
                }
            }
        }
    }
    Ok(())
}

/// The values a message holds for field `tag`, in wire order.
fn tagged<'a>(
    wire: &'a [(u64, Value<'a>)],
    tag: u32,
) -> impl DoubleEndedIterator<Item = Value<'a>> + 'a {
    wire.iter()
        .filter(move |(t, _)| *t == u64::from(tag))
        .map(|(_, v)| *v)
}

/// A whole message as a JSON value.
pub(super) fn message_value(
    msg: &'static Message,
    buf: &[u8],
    out: &mut String,
    style: Style,
) -> Result<(), ConvertError> {
    if msg.items_only {
        // {items: [...]} is the array itself; Go's protobuf decoder makes an empty one `[]`.
        let wire = kproto::fields(buf).ok_or_else(|| malformed(msg, "not a protobuf message"))?;
        let field = &msg.fields[0];
        let mut items = tagged(&wire, field.tag).peekable();
        if items.peek().is_none() {
            out.push_str(if field.flags & EMPTY_LIST != 0 {
                "[]"
            } else {
                "null"
            });
            return Ok(());
        }
        return array(msg, field, items, out, style);
    }
    let mut obj = Object::open(out);
    members(msg, buf, &mut obj, style)?;
    obj.close();
    Ok(())
}

fn array<'b>(
    msg: &'static Message,
    field: &Field,
    values: impl Iterator<Item = Value<'b>>,
    out: &mut String,
    style: Style,
) -> Result<(), ConvertError> {
    out.push('[');
    let mut first = true;
    for v in values {
        for v in unpacked(field.ty, v) {
            if !first {
                out.push(',');
            }
            first = false;
            value(msg, field, v, out, style)?;
        }
    }
    out.push(']');
    Ok(())
}

fn map<'b>(
    msg: &'static Message,
    field: &Field,
    entries: impl Iterator<Item = Value<'b>>,
    out: &mut String,
    style: Style,
) -> Result<(), ConvertError> {
    let mut obj = Object::open(out);
    for entry in entries {
        let Value::Bytes(b) = entry else {
            return Err(malformed(msg, "a map entry is not a message"));
        };
        let kv = kproto::fields(b).ok_or_else(|| malformed(msg, "a map entry is not a message"))?;
        let key = kv.iter().rev().find_map(|(t, v)| match (t, v) {
            (1, Value::Bytes(k)) => Some(*k),
            _ => None,
        });
        let key = std::str::from_utf8(key.unwrap_or_default())
            .map_err(|_| malformed(msg, "a map key is not UTF-8"))?;
        let val = kv.iter().rev().find_map(|(t, v)| (*t == 2).then_some(*v));
        let out = obj.key(key);
        match val {
            Some(v) => value(msg, field, v, out, style)?,
            // An absent value is the type's zero, as Go writes it.
            None => out.push_str(match field.ty {
                Type::String | Type::Bytes => "\"\"",
                Type::Quantity => "\"0\"",
                Type::IntOrString | Type::Int32 | Type::Int64 => "0",
                Type::Bool => "false",
                Type::Message(_) => "{}",
                Type::Time | Type::MicroTime | Type::RawJson => "null",
            }),
        }
    }
    obj.close();
    Ok(())
}

/// The packed form of a repeated number: one bytes value holding varints.
fn unpacked(ty: Type, v: Value<'_>) -> Vec<Value<'_>> {
    match (ty, v) {
        (Type::Int32 | Type::Int64 | Type::Bool, Value::Bytes(mut b)) => {
            let mut out = Vec::new();
            while !b.is_empty() {
                match kproto::varint(&mut b) {
                    Some(n) => out.push(Value::Varint(n)),
                    None => break,
                }
            }
            out
        }
        _ => vec![v],
    }
}

fn is_zero(v: Value<'_>) -> bool {
    match v {
        Value::Varint(n) | Value::Fixed64(n) => n == 0,
        Value::Fixed32(n) => n == 0,
        Value::Bytes(b) => b.is_empty(),
    }
}

/// One value of `field`, written to `out`.
fn value(
    msg: &'static Message,
    field: &Field,
    v: Value<'_>,
    out: &mut String,
    style: Style,
) -> Result<(), ConvertError> {
    let wrong = || {
        malformed(
            msg,
            &format!(
                "field {} ({}) has the wrong wire type",
                field.tag, field.json
            ),
        )
    };
    match (field.ty, v) {
        (Type::String, Value::Bytes(b)) => {
            let s = std::str::from_utf8(b).map_err(|_| malformed(msg, "a string is not UTF-8"))?;
            write_str(out, s);
        }
        (Type::Bool, Value::Varint(n)) => out.push_str(if n != 0 { "true" } else { "false" }),
        (Type::Int32, Value::Varint(n)) => out.push_str(&(n as i64 as i32).to_string()),
        (Type::Int64, Value::Varint(n)) => out.push_str(&(n as i64).to_string()),
        (Type::Bytes, Value::Bytes(b)) => {
            write_str(out, &base64::engine::general_purpose::STANDARD.encode(b));
        }
        (Type::Message(m), Value::Bytes(b)) => message_value(message(m), b, out, style)?,
        (Type::Time | Type::MicroTime, Value::Bytes(b)) => time(msg, field.ty, b, out)?,
        (Type::Quantity, Value::Bytes(b)) => {
            let f = kproto::fields(b).ok_or_else(wrong)?;
            let s = kproto::text(&f, 1);
            write_str(out, if s.is_empty() { "0" } else { &s });
        }
        (Type::IntOrString, Value::Bytes(b)) => {
            let f = kproto::fields(b).ok_or_else(wrong)?;
            if varint_field(&f, 1) == 1 {
                write_str(out, &kproto::text(&f, 3));
            } else {
                out.push_str(&(varint_field(&f, 2) as i64 as i32).to_string());
            }
        }
        (Type::RawJson, Value::Bytes(b)) => {
            let f = kproto::fields(b).ok_or_else(wrong)?;
            let raw = f.iter().rev().find_map(|(t, v)| match (t, v) {
                (1, Value::Bytes(r)) => Some(*r),
                _ => None,
            });
            match raw {
                None | Some([]) => out.push_str("null"),
                Some(raw) => {
                    let json: serde_json::Value = serde_json::from_slice(raw)
                        .map_err(|_| malformed(msg, "an embedded object is not JSON"))?;
                    out.push_str(&json.to_string());
                }
            }
        }
        _ => return Err(wrong()),
    }
    Ok(())
}

fn varint_field(f: &[(u64, Value<'_>)], tag: u64) -> u64 {
    f.iter()
        .rev()
        .find_map(|(t, v)| match v {
            Value::Varint(n) if *t == tag => Some(*n),
            _ => None,
        })
        .unwrap_or(0)
}

/// metav1.Time (RFC 3339 in seconds) or MicroTime (six fraction digits), in UTC; an empty
/// message is the zero time, `null` in JSON.
fn time(msg: &'static Message, ty: Type, b: &[u8], out: &mut String) -> Result<(), ConvertError> {
    if b.is_empty() {
        out.push_str("null");
        return Ok(());
    }
    let f = kproto::fields(b).ok_or_else(|| malformed(msg, "a time is not a message"))?;
    let seconds = varint_field(&f, 1) as i64;
    let nanos = varint_field(&f, 2) as i64 as i32;
    // Go's encoding refuses what RFC 3339 cannot write; so does this.
    if !(0..1_000_000_000).contains(&nanos) {
        return Err(malformed(msg, "a time's nanoseconds are out of range"));
    }
    let (y, mo, d, h, mi, s) = civil(seconds);
    if !(0..=9999).contains(&y) {
        return Err(malformed(msg, "a time's year is outside 0..9999"));
    }
    let frac = if ty == Type::MicroTime {
        format!(".{:06}", nanos / 1000)
    } else {
        String::new()
    };
    write_str(
        out,
        &format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}{frac}Z"),
    );
    Ok(())
}

/// Unix seconds -> (year, month, day, hour, minute, second) in UTC (Howard Hinnant's
/// days-from-civil inverse).
pub(super) fn civil(t: i64) -> (i64, i64, i64, i64, i64, i64) {
    let days = t.div_euclid(86_400);
    let rem = t.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d, rem / 3600, rem % 3600 / 60, rem % 60)
}

fn malformed(msg: &Message, why: &str) -> ConvertError {
    ConvertError::Malformed(format!("{}: {why}", msg.name))
}
