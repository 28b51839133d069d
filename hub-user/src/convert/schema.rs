//! The shape of the generated schema table (schema_table.rs): per protobuf message, its
//! fields' numbers, JSON names, types and the JSON rules Go's types put on them.

/// A field's value type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    String,
    Bool,
    Int32,
    Int64,
    /// `[]byte`: base64 in JSON.
    Bytes,
    /// An index into `MESSAGES`.
    Message(u16),
    /// metav1.Time: RFC 3339 in seconds, `null` when zero.
    Time,
    /// metav1.MicroTime: RFC 3339 in microseconds, `null` when zero.
    MicroTime,
    /// resource.Quantity: its canonical string.
    Quantity,
    /// intstr.IntOrString: a number or a string.
    IntOrString,
    /// runtime.RawExtension and metav1.FieldsV1: JSON bytes carried as they are.
    RawJson,
}

/// How many values a field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Card {
    One,
    Repeated,
    /// `map<string, T>`: repeated entries {key 1, value 2}.
    Map,
}

/// A scalar held by value with `omitempty`: always on the protobuf wire, its zero dropped in
/// JSON.
pub const DROP_ZERO: u8 = 1;
/// A list, map, pointer or `[]byte` without `omitempty`: `null` in JSON when absent on the
/// wire (empty, or a nil pointer).
pub const NULL_IF_ABSENT: u8 = 2;
/// A List kind's items: `[]` when empty, as kube-apiserver writes them.
pub const EMPTY_LIST: u8 = 4;
/// A Go struct embedded with `json:",inline"`: its own message in protobuf, its fields in
/// the parent's JSON object.
pub const INLINE: u8 = 8;
/// A struct Go tags `omitzero`: kube-apiserver 1.34 and later leave its zero out of JSON,
/// older ones write `null` (metadata.creationTimestamp).
pub const OMITZERO: u8 = 16;
/// Strategic merge patch merges this list (by its merge key, `MERGE_KEYS`, or as a set of
/// scalars) or this map, rather than replacing it.
pub const PATCH_MERGE: u8 = 32;
/// Strategic merge patch replaces this value whole.
pub const PATCH_REPLACE: u8 = 64;
/// Strategic merge patch honours `$retainKeys` in this value (a union such as a volume's
/// source).
pub const RETAIN_KEYS: u8 = 128;

#[derive(Debug)]
pub struct Field {
    pub tag: u32,
    pub json: &'static str,
    pub ty: Type,
    pub card: Card,
    pub flags: u8,
}

#[derive(Debug)]
pub struct Message {
    /// Its source path, e.g. `api/core/v1/Pod`.
    pub name: &'static str,
    /// A named slice (`type ExtraValue []string`): a message of `items` in protobuf, an array
    /// in JSON.
    pub items_only: bool,
    /// In field-number order.
    pub fields: &'static [Field],
}

/// A top-level kind and its message.
#[derive(Debug)]
pub struct Kind {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub message: u16,
}

impl Message {
    pub fn field_by_tag(&self, tag: u64) -> Option<&'static Field> {
        let fields: &'static [Field] = self.fields;
        fields.iter().find(|f| u64::from(f.tag) == tag)
    }
}
