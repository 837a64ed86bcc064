//! Where svcplane learns the cluster state from a directory of Kubernetes manifests, and the
//! conversion of Kubernetes objects into the core's model that every feed shares (the API
//! feed in `svcplane-kube` uses it too).
//!
//! - [`feed`] is the manifests feed: for the proxy, each edit's changed objects go through
//!   the controller step for just the Services they touch and out as the
//!   [`svcplane_core::Change`]s they make; for cluster DNS, complete discovery views.
//! - [`manifests`] loads every `*.yaml`, `*.yml` and `*.json` file of a directory into
//!   k8s-openapi objects ([`ClusterObjects`]), remembering which file each came from and
//!   reporting every broken document without dropping the rest; [`parse_manifest_text`]
//!   parses one file's text the same way (the fuzz target and tests use it). Plain
//!   documents (block style, plain scalars) are read by a fast reader of that subset,
//!   `simple_yaml`; everything else, and every document with a problem, by the YAML parser.
//! - [`watch`] notices edits, additions and deletions in that directory; `store` keeps
//!   the directory file by file and document by document, so an edit re-parses only the
//!   documents whose text changed and yields only the objects that changed.
//! - [`convert`] validates Services, EndpointSlices and Nodes and converts them into
//!   [`svcplane_core`] values; errors name the file, the object and the field.
//! - [`diff`] turns successive full snapshots into the minimal [`svcplane_core::Change`]s.
//! - [`dns_view`] converts Services (headless and ExternalName too) and EndpointSlices into
//!   the core's discovery model.
//!
//! What it deliberately does not do: no ClusterIP / NodePort allocation and no EndpointSlice
//! generation from Pods (that is the controller crate, which takes [`ClusterObjects`]), no
//! Service policy decisions (the core), and nothing with the kernel (the backends). No async
//! runtime either: the watcher is a polling thread.

pub mod convert;
mod delta;
pub mod diff;
pub mod dns_view;
pub mod feed;
mod held;
pub mod manifests;
mod named_table;
mod postings;
mod simple_yaml;
mod store;
pub mod watch;

/// The maps the feed fills with one entry per object (110,000 at 10k Services x 10 Pods),
/// hashed with foldhash instead of SipHash: the keys come from the operator's own files,
/// so hash flooding is not a concern, and SipHash was a tenth of storing the first read.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub(crate) type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

pub use convert::{
    Converted, FieldError, Problem, convert_objects, new_slice_address_errors, node_to_core, service_to_core,
    slice_to_core,
};
pub use diff::{PartialSnapshot, SnapshotDiffer};
pub use dns_view::{DnsServicePart, DnsSlicePart, DnsView, assemble_view, dns_view, service_to_dns};
pub use feed::{FeedError, ManifestsFeed, ManifestsSettings};
pub use manifests::{
    ClusterObjects, Loaded, ManifestError, ObjectKind, ObjectName, ObjectRef, Origins, Position, load_directory,
    parse_manifest_text,
};
pub use store::{Phases, StoreCounters};
pub use watch::{DEFAULT_POLL_INTERVAL, DirectoryWatcher};
