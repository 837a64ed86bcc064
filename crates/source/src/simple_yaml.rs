//! A fast reader for the plainest YAML documents: block mappings and sequences of plain or
//! simply quoted scalars, the way generated manifests are written. It either returns the
//! document as a JSON value or gives up (`None`), and the caller then parses the document
//! with the full YAML parser, as before; anything it is unsure about makes it give up.
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
//! caller decodes the value into its type and, if that fails, parses the document with the
//! full parser, so a type this reader chose differently can only cost time, never change
//! an answer or an error message.

use serde_json::{Map, Value};

/// One non-blank, non-comment line: its indentation and its content.
#[derive(Debug, Clone, Copy)]
struct Line<'a> {
    indent: usize,
    text: &'a str,
}

/// The document as a JSON value, or `None` when it is not plain enough (see the module).
pub(crate) fn parse(text: &str) -> Option<Value> {
    let mut lines = Vec::new();
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
    let value = node(&mut lines, &mut at, 0)?;
    (at == lines.len()).then_some(value)
}

/// The block node starting at line `at` (indented `indent`).
fn node(lines: &mut [Line<'_>], at: &mut usize, indent: usize) -> Option<Value> {
    if is_item(lines[*at].text) { sequence(lines, at, indent) } else { mapping(lines, at, indent) }
}

fn is_item(text: &str) -> bool {
    text == "-" || text.starts_with("- ")
}

fn mapping(lines: &mut [Line<'_>], at: &mut usize, indent: usize) -> Option<Value> {
    let mut map = Map::new();
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
                Some(next) if next.indent > indent => node(lines, at, next.indent)?,
                Some(next) if next.indent == indent && is_item(next.text) => sequence(lines, at, indent)?,
                _ => Value::Null,
            }
        } else {
            scalar(rest)?
        };
        if map.insert(key.to_owned(), value).is_some() {
            return None;
        }
    }
    Some(Value::Object(map))
}

fn sequence(lines: &mut [Line<'_>], at: &mut usize, indent: usize) -> Option<Value> {
    let mut items = Vec::new();
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
        if split_key(item).is_some() {
            // A mapping whose first key is on the item's line: read it as if that line
            // stood on its own at the item's content indentation.
            let inner = indent + 2 + (rest.len() - item.len());
            lines[*at] = Line { indent: inner, text: item };
            items.push(mapping(lines, at, inner)?);
        } else {
            *at += 1;
            items.push(scalar(item)?);
        }
    }
    Some(Value::Array(items))
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

fn scalar(text: &str) -> Option<Value> {
    let first = text.as_bytes()[0];
    match first {
        b'"' => {
            let inner = text.strip_prefix('"')?.strip_suffix('"')?;
            return (!inner.contains(['"', '\\'])).then(|| Value::String(inner.to_owned()));
        }
        b'\'' => {
            let inner = text.strip_prefix('\'')?.strip_suffix('\'')?;
            return (!inner.contains('\'')).then(|| Value::String(inner.to_owned()));
        }
        _ => {}
    }
    match text {
        "{}" => return Some(Value::Object(Map::new())),
        "[]" => return Some(Value::Array(Vec::new())),
        _ => {}
    }
    if b"-?:,[]{}#&*!|>%@`".contains(&first) && !(first == b'-' && text.len() > 1 && text.as_bytes()[1] != b' ') {
        return None;
    }
    if text.contains(": ") || text.contains(" #") || text.ends_with(':') {
        return None;
    }
    match text {
        "~" | "null" | "Null" | "NULL" => return Some(Value::Null),
        "true" | "True" | "TRUE" => return Some(Value::Bool(true)),
        "false" | "False" | "FALSE" => return Some(Value::Bool(false)),
        _ => {}
    }
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        if digits.len() > 1 && digits.starts_with('0') {
            return None;
        }
        return text.parse::<i64>().ok().map(Value::from);
    }
    if looks_numeric(text) {
        return None;
    }
    Some(Value::String(text.to_owned()))
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
}
