//! A fast reader for the plainest YAML documents: block mappings and sequences of plain or
//! simply quoted scalars, the way generated manifests are written. It either reads the
//! document into the caller's type or gives up (`None`), and the caller then parses the
//! document with the full YAML parser, as before; anything it is unsure about makes it
//! give up.
//!
//! Why: the full parser costs ~100 µs per small document, which at 110,000 documents (10k
//! Services x 10 Pods) was most of a cold start. This reader costs a few microseconds.
//!
//! What it accepts: space indentation; `key: value` and `key:` lines with plain keys; `- `
//! sequence items, of scalars or of mappings (also at the indentation of their key, as
//! `kubectl` writes them); plain scalars, `"..."` without escapes and `'...'` without
//! doubled quotes; `{}` and `[]`; whole-line comments; a leading `---` line.
//! What makes it give up: anything else (flow collections, anchors, aliases, tags, block
//! scalars, multi-line scalars, comments after a value, tabs, duplicate keys, numbers other
//! than plain decimal integers).
//!
//! A plain scalar is typed as the YAML 1.2 core schema types it: `null` / `~` / empty,
//! `true` / `false`, decimal integers; everything else that is not a float is a string. A
//! caller decodes the document into its type and, if that fails, parses the document with
//! the full parser, so a type this reader chose differently can only cost time, never
//! change an answer or an error message.
//!
//! The document is read into a [`Node`] tree that borrows its strings from the text (its
//! collections in buffers a thread reuses from document to document, [`Scratch`]), and
//! the caller's type is deserialized from that tree the way it would be from the JSON value
//! of the document (numbers, nulls, options and enums alike): no key or string is copied
//! on the way, and a failed decode says only that the fast path does not apply.

use std::fmt;

use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};
use serde::forward_to_deserialize_any;
#[cfg(test)]
use serde_json::Value;

/// A plain document's node, its strings borrowed from the text. A collection is a span
/// of its tree's entries ([`Scratch`]): mapping entries keep the document's order (keys
/// are unique: a duplicate makes the reader give up); sequence items have empty keys.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Node<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Str(&'a str),
    Seq(Span),
    Map(Span),
}

/// Where a collection's entries are among its tree's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Span {
    start: u32,
    len: u32,
}

/// What reading a document needs beyond its text: its lines, and its tree's entries, each
/// collection's together. One thread reads document after document with one `Scratch`, so
/// once its buffers have grown a plain document costs no allocation of its own (a tree of
/// its own vectors was a dozen allocations per Pod, a third of the parse).
#[derive(Debug, Default)]
pub(crate) struct Scratch<'a> {
    lines: Vec<Line<'a>>,
    tree: Tree<'a>,
}

#[derive(Debug, Default)]
struct Tree<'a> {
    /// Every collection's entries, each collection's contiguous.
    entries: Vec<(&'a str, Node<'a>)>,
    /// The entries of the collections being read, moved to `entries` when one ends.
    pending: Vec<(&'a str, Node<'a>)>,
}

impl<'a> Tree<'a> {
    /// Moves the pending entries from `mark` on into place, as one collection.
    fn close(&mut self, mark: usize) -> Option<Span> {
        let start = u32::try_from(self.entries.len()).ok()?;
        let len = u32::try_from(self.pending.len() - mark).ok()?;
        self.entries.extend(self.pending.drain(mark..));
        Some(Span { start, len })
    }

    fn of(&self, span: Span) -> &[(&'a str, Node<'a>)] {
        &self.entries[span.start as usize..(span.start + span.len) as usize]
    }
}

/// The document decoded into `T`, or `None` when it is not plain enough (see the module)
/// or does not decode: the caller then asks the full parser, whose errors name lines.
pub(crate) fn decode<'a, T: de::Deserialize<'a>>(text: &'a str, scratch: &mut Scratch<'a>) -> Option<T> {
    let root = tree(text, scratch)?;
    T::deserialize(At { tree: &scratch.tree, node: root }).ok()
}

/// The document as a JSON value (tests compare it with the full parser's).
#[cfg(test)]
pub(crate) fn parse(text: &str) -> Option<Value> {
    decode(text, &mut Scratch::default())
}

/// Whether the document is plain enough for this reader (tests).
#[cfg(test)]
pub(crate) fn is_plain(text: &str) -> bool {
    tree(text, &mut Scratch::default()).is_some()
}

/// One non-blank, non-comment line: its indentation and its content.
#[derive(Debug, Clone, Copy)]
struct Line<'a> {
    indent: usize,
    text: &'a str,
}

/// The document's root node, its collections in `scratch`; `None` when it is not plain
/// enough (see the module).
fn tree<'a>(text: &'a str, scratch: &mut Scratch<'a>) -> Option<Node<'a>> {
    let Scratch { lines, tree } = scratch;
    lines.clear();
    tree.entries.clear();
    tree.pending.clear();
    for raw in text.lines() {
        if raw.contains('\t') || raw.ends_with('\r') {
            return None;
        }
        let content = raw.trim_start_matches(' ');
        let trimmed = content.trim_end();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if lines.is_empty() && raw == "---" {
            continue;
        }
        if raw.starts_with("---") || raw.starts_with("...") || raw.starts_with('%') {
            return None;
        }
        lines.push(Line { indent: raw.len() - content.len(), text: trimmed });
    }
    let first = *lines.first()?;
    if first.indent != 0 {
        return None;
    }
    let mut at = 0;
    let value = node(lines, &mut at, 0, tree)?;
    (at == lines.len()).then_some(value)
}

/// The block node starting at line `at` (indented `indent`).
fn node<'a>(lines: &mut [Line<'a>], at: &mut usize, indent: usize, tree: &mut Tree<'a>) -> Option<Node<'a>> {
    if is_item(lines[*at].text) { sequence(lines, at, indent, tree) } else { mapping(lines, at, indent, tree) }
}

fn is_item(text: &str) -> bool {
    text == "-" || text.starts_with("- ")
}

fn mapping<'a>(lines: &mut [Line<'a>], at: &mut usize, indent: usize, tree: &mut Tree<'a>) -> Option<Node<'a>> {
    let mark = tree.pending.len();
    while let Some(&line) = lines.get(*at) {
        if line.indent < indent {
            break;
        }
        if line.indent > indent || is_item(line.text) {
            // A sequence at the mapping's own indentation belongs to the key before it;
            // anything else here is not plain.
            return None;
        }
        let (key, rest) = split_key(line.text)?;
        *at += 1;
        let value = if rest.is_empty() {
            match lines.get(*at) {
                Some(next) if next.indent > indent => node(lines, at, next.indent, tree)?,
                Some(next) if next.indent == indent && is_item(next.text) => sequence(lines, at, indent, tree)?,
                _ => Node::Null,
            }
        } else {
            scalar(rest)?
        };
        if tree.pending[mark..].iter().any(|(seen, _)| *seen == key) {
            return None;
        }
        tree.pending.push((key, value));
    }
    Some(Node::Map(tree.close(mark)?))
}

fn sequence<'a>(lines: &mut [Line<'a>], at: &mut usize, indent: usize, tree: &mut Tree<'a>) -> Option<Node<'a>> {
    let mark = tree.pending.len();
    while let Some(&line) = lines.get(*at) {
        if line.indent < indent || (line.indent == indent && !is_item(line.text)) {
            break;
        }
        if line.indent > indent || line.text == "-" {
            return None;
        }
        let rest = &line.text[2..];
        let item = rest.trim_start_matches(' ');
        if is_item(item) {
            return None;
        }
        let value = if split_key(item).is_some() {
            // A mapping whose first key is on the item's line: read it as if that line
            // stood on its own at the item's content indentation.
            let inner = indent + 2 + (rest.len() - item.len());
            lines[*at] = Line { indent: inner, text: item };
            mapping(lines, at, inner, tree)?
        } else {
            *at += 1;
            scalar(item)?
        };
        tree.pending.push(("", value));
    }
    Some(Node::Seq(tree.close(mark)?))
}

/// `key: rest` or `key:` with a plain key; `None` when the line is not one.
fn split_key(text: &str) -> Option<(&str, &str)> {
    let (key, rest) = match text.find(": ") {
        Some(at) => (&text[..at], text[at + 2..].trim_start_matches(' ')),
        None => (text.strip_suffix(':')?, ""),
    };
    let plain = !key.is_empty()
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || b"._/-".contains(&b))
        && !key.starts_with('-');
    plain.then_some((key, rest))
}

fn scalar(text: &str) -> Option<Node<'_>> {
    let first = text.as_bytes()[0];
    match first {
        b'"' => {
            let inner = text.strip_prefix('"')?.strip_suffix('"')?;
            return (!inner.contains(['"', '\\'])).then_some(Node::Str(inner));
        }
        b'\'' => {
            let inner = text.strip_prefix('\'')?.strip_suffix('\'')?;
            return (!inner.contains('\'')).then_some(Node::Str(inner));
        }
        _ => {}
    }
    match text {
        "{}" => return Some(Node::Map(Span { start: 0, len: 0 })),
        "[]" => return Some(Node::Seq(Span { start: 0, len: 0 })),
        _ => {}
    }
    if b"-?:,[]{}#&*!|>%@`".contains(&first) && !(first == b'-' && text.len() > 1 && text.as_bytes()[1] != b' ') {
        return None;
    }
    if text.contains(": ") || text.contains(" #") || text.ends_with(':') {
        return None;
    }
    match text {
        "~" | "null" | "Null" | "NULL" => return Some(Node::Null),
        "true" | "True" | "TRUE" => return Some(Node::Bool(true)),
        "false" | "False" | "FALSE" => return Some(Node::Bool(false)),
        _ => {}
    }
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        if digits.len() > 1 && digits.starts_with('0') {
            return None;
        }
        return text.parse::<i64>().ok().map(Node::Int);
    }
    if looks_numeric(text) {
        return None;
    }
    Some(Node::Str(text))
}

/// Floats, `.inf` / `.nan`, octal and hexadecimal integers: left to the full parser.
fn looks_numeric(text: &str) -> bool {
    let body = text.strip_prefix(['-', '+']).unwrap_or(text);
    let lower = body.to_ascii_lowercase();
    if matches!(lower.as_str(), ".inf" | ".nan") || lower.starts_with("0x") || lower.starts_with("0o") {
        return true;
    }
    // [0-9]* ( . [0-9]* )? ( [eE] [-+]? [0-9]+ )? with at least one digit.
    let (mantissa, exponent) = match lower.split_once('e') {
        Some((mantissa, exponent)) => (mantissa, Some(exponent)),
        None => (lower.as_str(), None),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = digits(whole) && digits(fraction) && !(whole.is_empty() && fraction.is_empty());
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['-', '+']).unwrap_or(e);
        !e.is_empty() && digits(e)
    });
    mantissa_ok && exponent_ok
}

/// Why a tree did not decode into a type; only ever a reason to take the full parser.
#[derive(Debug)]
pub(crate) struct Mismatch(String);

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Mismatch {}

impl de::Error for Mismatch {
    fn custom<T: fmt::Display>(message: T) -> Self {
        Mismatch(message.to_string())
    }
}

/// A node of a tree, as a deserializer.
#[derive(Clone, Copy)]
struct At<'t, 'a> {
    tree: &'t Tree<'a>,
    node: Node<'a>,
}

/// Decodes as `serde_json::Value` does from the document's JSON value: non-negative
/// integers as `u64`, `null` as unit or `None`, a string as a unit enum variant.
impl<'de> de::Deserializer<'de> for At<'_, 'de> {
    type Error = Mismatch;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Mismatch> {
        match self.node {
            Node::Null => visitor.visit_unit(),
            Node::Bool(value) => visitor.visit_bool(value),
            Node::Int(value) => match u64::try_from(value) {
                Ok(value) => visitor.visit_u64(value),
                Err(_) => visitor.visit_i64(value),
            },
            Node::Str(text) => visitor.visit_borrowed_str(text),
            Node::Seq(span) => {
                let items = self.tree.of(span);
                let mut access = Items { tree: self.tree, items: items.iter() };
                let value = visitor.visit_seq(&mut access)?;
                match access.items.len() {
                    0 => Ok(value),
                    left => Err(de::Error::invalid_length(items.len() - left, &"fewer elements in the sequence")),
                }
            }
            Node::Map(span) => {
                let entries = self.tree.of(span);
                let mut access = Entries { tree: self.tree, entries: entries.iter(), value: None };
                let value = visitor.visit_map(&mut access)?;
                match access.entries.len() {
                    0 => Ok(value),
                    left => Err(de::Error::invalid_length(entries.len() - left, &"fewer elements in the map")),
                }
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Mismatch> {
        match self.node {
            Node::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value, Mismatch> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Mismatch> {
        match self.node {
            Node::Str(variant) => visitor.visit_enum(variant.into_deserializer()),
            // Enums with content: left to the full parser.
            _ => Err(de::Error::custom("a plain document's enums are unit variants")),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Mismatch> {
        visitor.visit_unit()
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf unit
        unit_struct seq tuple tuple_struct map struct identifier
    }
}

struct Items<'t, 'de> {
    tree: &'t Tree<'de>,
    items: std::slice::Iter<'t, (&'de str, Node<'de>)>,
}

impl<'de> de::SeqAccess<'de> for Items<'_, 'de> {
    type Error = Mismatch;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Mismatch> {
        self.items.next().map(|(_, item)| seed.deserialize(At { tree: self.tree, node: *item })).transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

struct Entries<'t, 'de> {
    tree: &'t Tree<'de>,
    entries: std::slice::Iter<'t, (&'de str, Node<'de>)>,
    value: Option<Node<'de>>,
}

impl<'de> de::MapAccess<'de> for Entries<'_, 'de> {
    type Error = Mismatch;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Mismatch> {
        let Some((key, value)) = self.entries.next() else { return Ok(None) };
        self.value = Some(*value);
        seed.deserialize(de::value::BorrowedStrDeserializer::new(key)).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Mismatch> {
        let value = self.value.take().ok_or_else(|| de::Error::custom("a value without its key"))?;
        seed.deserialize(At { tree: self.tree, node: value })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(text: &str) -> Value {
        serde_saphyr::from_str(text).expect("the full parser reads it")
    }

    #[test]
    fn plain_documents_read_as_the_full_parser_reads_them() {
        let documents = [
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: svc-1\n  namespace: bench\nspec:\n  clusterIP: 198.19.0.16\n  selector:\n    app: svc-1\n  ports:\n    - name: http\n      port: 80\n      targetPort: 8080\n",
            "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  labels:\n    app.kubernetes.io/name: web\nspec:\n  nodeName: node2\n  containers:\n  - name: app\n    image: bench\n    ports:\n    - containerPort: 80\n      name: http\nstatus:\n  podIPs:\n    - ip: 198.18.160.1\n  conditions:\n    - type: Ready\n      status: \"True\"\n# a comment\n",
            "a: ''\nb: []\nc: {}\nd:\ne: -1\nf: 'x y'\ng: -x\nh: 2001:db8::1\ni: true\nj: ~\n",
        ];
        for text in documents {
            assert_eq!(parse(text), Some(full(text)), "{text}");
        }
    }

    #[test]
    fn anything_less_plain_is_left_to_the_full_parser() {
        for text in [
            "a: {b: 1}\n",
            "a: [1, 2]\n",
            "a: &x 1\nb: *x\n",
            "a: |\n  text\n",
            "a: 1.5\n",
            "a: .inf\n",
            "a: 0x1f\n",
            "a: 010\n",
            "a: 1 # comment\n",
            "a: \"q\\\"\"\n",
            "a: b\na: c\n",
            "a:\n\tb: 1\n",
            "a: text\n  more text\n",
            "- - 1\n",
            "\"key\": 1\n",
            "a: !!str 1\n",
        ] {
            assert_eq!(parse(text), None, "{text}");
        }
    }

    #[test]
    fn one_scratch_reads_document_after_document_as_fresh_ones_do_even_after_giving_up_halfway() {
        let documents = [
            "a:\n  b:\n    - x: 1\n      y: []\n    - 2\nc: z\n",
            "a:\n  b: 1\n  c: {d: 1}\n",
            "- a: 1\n  b:\n  - 1\n  - 2\n- c\n",
            "a: b\na: c\n",
            "kind: Pod\nmetadata:\n  labels: {}\n  name: p\nspec:\n  containers: []\n",
        ];
        let mut scratch = Scratch::default();
        for text in documents.iter().chain(&documents) {
            let reused: Option<Value> = decode(text, &mut scratch);
            assert_eq!(reused, parse(text), "{text}");
        }
        assert_eq!(parse(documents[0]), Some(full(documents[0])));
        assert_eq!(parse(documents[1]), None, "a flow mapping: given up halfway");
    }
}
