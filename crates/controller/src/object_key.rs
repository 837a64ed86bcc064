//! `namespace/name` of the objects this crate reads.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The namespace manifests without `metadata.namespace` belong to, as with `kubectl apply`.
pub(crate) const DEFAULT_NAMESPACE: &str = "default";

/// A namespaced object name, displayed as `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), name: name.into() }
    }

    /// The key of an object; a missing namespace is `default`, a missing name is empty.
    pub fn of(meta: &ObjectMeta) -> Self {
        Self::new(namespace_of(meta), meta.name.clone().unwrap_or_default())
    }

    /// Parses `namespace/name` (the form [`Display`](fmt::Display) writes).
    pub fn parse(value: &str) -> Option<Self> {
        let (namespace, name) = value.split_once('/')?;
        if namespace.is_empty() || name.is_empty() || name.contains('/') {
            return None;
        }
        Some(Self::new(namespace, name))
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// `metadata.namespace`, or `default` when it is absent or empty.
pub(crate) fn namespace_of(meta: &ObjectMeta) -> &str {
    match meta.namespace.as_deref() {
        Some(namespace) if !namespace.is_empty() => namespace,
        _ => DEFAULT_NAMESPACE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_parses_back_from_its_display_form() {
        let key = ObjectKey::new("kube-system", "dns");
        assert_eq!(key.to_string(), "kube-system/dns");
        assert_eq!(ObjectKey::parse("kube-system/dns"), Some(key));
    }

    #[test]
    fn keys_without_both_parts_do_not_parse() {
        assert_eq!(ObjectKey::parse("dns"), None);
        assert_eq!(ObjectKey::parse("/dns"), None);
        assert_eq!(ObjectKey::parse("kube-system/"), None);
        assert_eq!(ObjectKey::parse("a/b/c"), None);
    }

    #[test]
    fn a_missing_namespace_is_the_default_namespace() {
        let meta = ObjectMeta { name: Some("web".into()), ..ObjectMeta::default() };
        assert_eq!(ObjectKey::of(&meta), ObjectKey::new("default", "web"));
    }
}
