//! Loading a directory of Kubernetes manifests into k8s-openapi objects.
//!
//! Every `*.yaml`, `*.yml` and `*.json` file under the directory is read, recursively, in
//! sorted path order; names starting with `.` are skipped (editor swap files, and the
//! `..data` links of a mounted ConfigMap, whose top-level links are followed instead).
//! YAML files may hold several `---`-separated documents, JSON files a stream of objects;
//! either may hold a `List` (`kind: List`, or `ServiceList` and friends, whose items may then
//! omit `apiVersion` and `kind`).
//!
//! Services, Pods and Nodes (`v1`), EndpointSlices (`discovery.k8s.io/v1`) and
//! LoadBalancer address pools (`LoadBalancerIPPool`, `svcplane.io/v1alpha1`) are kept;
//! every other kind is ignored. A broken document is reported once, with its file, line and
//! field where known, and everything else still loads. When two documents define the same
//! object, the first in path order wins and the second is reported.

use std::collections::HashMap;
use std::collections::HashSet;
use std::collections::hash_map::Entry;
use std::ffi::OsStr;
use std::fmt;
use std::fs;
use std::io;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use svcplane_controller::load_balancer::LoadBalancerIPPool;
use tracing::debug;

use crate::held::PodRecord;
use crate::simple_yaml;

/// The namespace of a namespaced object whose manifest does not name one.
pub const DEFAULT_NAMESPACE: &str = "default";

/// How deep the directory walk goes before it stops descending.
const MAX_DIRECTORY_DEPTH: usize = 64;

/// Below this much text, parsing on one thread is faster than starting more.
const PARALLEL_PARSE_THRESHOLD: usize = 256 * 1024;

/// Most threads one load parses on.
const MAX_PARSE_THREADS: usize = 8;

/// The kinds of object this crate reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    Service,
    Pod,
    Node,
    EndpointSlice,
    /// `svcplane.io/v1alpha1`: LoadBalancer address pools.
    LoadBalancerIPPool,
}

impl ObjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Service => "Service",
            ObjectKind::Pod => "Pod",
            ObjectKind::Node => "Node",
            ObjectKind::EndpointSlice => "EndpointSlice",
            ObjectKind::LoadBalancerIPPool => "LoadBalancerIPPool",
        }
    }

    /// The `apiVersion` this crate reads the kind at.
    pub fn api_version(self) -> &'static str {
        match self {
            ObjectKind::Service | ObjectKind::Pod | ObjectKind::Node => "v1",
            ObjectKind::EndpointSlice => "discovery.k8s.io/v1",
            ObjectKind::LoadBalancerIPPool => "svcplane.io/v1alpha1",
        }
    }

    /// Nodes and pools are cluster-scoped; the other kinds live in a namespace.
    pub fn is_namespaced(self) -> bool {
        !matches!(self, ObjectKind::Node | ObjectKind::LoadBalancerIPPool)
    }

    fn from_type_meta(api_version: &str, kind: &str) -> Option<Self> {
        let kind = match kind {
            "Service" => ObjectKind::Service,
            "Pod" => ObjectKind::Pod,
            "Node" => ObjectKind::Node,
            "EndpointSlice" => ObjectKind::EndpointSlice,
            "LoadBalancerIPPool" => ObjectKind::LoadBalancerIPPool,
            _ => return None,
        };
        (kind.api_version() == api_version).then_some(kind)
    }

    /// For `ServiceList` and friends: the kind of their items.
    fn of_typed_list(api_version: &str, kind: &str) -> Option<Self> {
        Self::from_type_meta(api_version, kind.strip_suffix("List")?)
    }
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Names one object: kind, namespace (empty for Nodes) and name.
///
/// The namespace is shared ([`svcplane_core::model::intern`]): a store names every object
/// it holds (110k at 10k Services x 10 Pods), and most of them share a few namespaces.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    pub kind: ObjectKind,
    /// Empty for cluster-scoped kinds.
    pub namespace: Arc<str>,
    pub name: ObjectName,
}

impl ObjectRef {
    pub fn new(kind: ObjectKind, namespace: impl AsRef<str>, name: impl AsRef<str>) -> Self {
        Self { kind, namespace: svcplane_core::model::intern(namespace.as_ref()), name: ObjectName::new(name.as_ref()) }
    }

    /// The reference of an object with this metadata: a namespaced kind without a namespace
    /// is in [`DEFAULT_NAMESPACE`], a cluster-scoped kind has none.
    pub fn from_meta(kind: ObjectKind, meta: &ObjectMeta) -> Self {
        let namespace = if kind.is_namespaced() {
            meta.namespace.as_deref().filter(|ns| !ns.is_empty()).unwrap_or(DEFAULT_NAMESPACE)
        } else {
            ""
        };
        Self::new(kind, namespace, meta.name.as_deref().unwrap_or_default())
    }
}

/// The longest name an [`ObjectName`] holds inline.
const INLINE_NAME: usize = 22;

/// An object's name: inline when it is short, as most are, else boxed. A store names every
/// object it holds (110k at 10k Services x 10 Pods); inline, a name is no allocation of its
/// own (a short boxed name took a 32-byte chunk). Compares, orders and hashes as its text.
#[derive(Clone)]
pub struct ObjectName(NameText);

#[derive(Clone)]
enum NameText {
    Inline { len: u8, bytes: [u8; INLINE_NAME] },
    Boxed(Box<str>),
}

impl ObjectName {
    pub fn new(name: &str) -> Self {
        if name.len() <= INLINE_NAME {
            let mut bytes = [0; INLINE_NAME];
            bytes[..name.len()].copy_from_slice(name.as_bytes());
            Self(NameText::Inline { len: name.len() as u8, bytes })
        } else {
            Self(NameText::Boxed(Box::from(name)))
        }
    }

    pub fn as_str(&self) -> &str {
        match &self.0 {
            NameText::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).expect("an inline name holds the whole text of a str")
            }
            NameText::Boxed(name) => name,
        }
    }

    /// The name's bytes, without the UTF-8 check [`Self::as_str`] makes: comparing and
    /// ordering names (the store's maps do it for every object it holds) need no more.
    fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            NameText::Inline { len, bytes } => &bytes[..usize::from(*len)],
            NameText::Boxed(name) => name.as_bytes(),
        }
    }
}

impl std::ops::Deref for ObjectName {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for ObjectName {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for ObjectName {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for ObjectName {}

impl PartialOrd for ObjectName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ObjectName {
    /// As the text orders: `str` orders byte by byte.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl std::hash::Hash for ObjectName {
    /// As the text hashes (`str` writes its bytes and a 0xff end marker).
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write(self.as_bytes());
        state.write_u8(0xff);
    }
}

impl fmt::Debug for ObjectName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for ObjectName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for ObjectRef {
    /// `Service default/web`, or `Node node-1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// The objects of a cluster that svcplane cares about, as Kubernetes spells them: the
/// controller's input type, so a load feeds it without conversion.
pub use svcplane_controller::ClusterObjects;

/// Where each loaded object was defined (file, line, document), so later errors can say.
#[derive(Debug, Clone, Default)]
pub struct Origins {
    positions: HashMap<ObjectRef, Position>,
}

impl Origins {
    pub fn new() -> Self {
        Self::default()
    }

    /// The file that defined `object`, if it came from one.
    pub fn file_of(&self, object: &ObjectRef) -> Option<&Path> {
        self.positions.get(object).map(|position| &*position.file)
    }

    /// Where `object` was defined, if it came from a file.
    pub fn position_of(&self, object: &ObjectRef) -> Option<&Position> {
        self.positions.get(object)
    }

    /// Records where `object` came from; returns what was recorded before, if anything.
    pub fn insert(&mut self, object: ObjectRef, position: Position) -> Option<Position> {
        self.positions.insert(object, position)
    }

    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }
}

/// The result of loading a directory: the objects, where they came from, and every problem.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    pub objects: ClusterObjects,
    pub origins: Origins,
    /// In path order, then document order.
    pub errors: Vec<ManifestError>,
}

/// Where in the manifests something is: a file, and where known the document, line and
/// `List` item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub file: Arc<Path>,
    /// 1-based; only set when the file holds more than one document.
    pub document: Option<usize>,
    /// 1-based line in the file: of the problem, or of the start of the object.
    pub line: Option<u64>,
    /// 0-based index in the `items` of a `List`.
    pub item: Option<usize>,
}

impl Position {
    /// The whole of `file`.
    pub fn file(file: &Arc<Path>) -> Self {
        Self { file: Arc::clone(file), document: None, line: None, item: None }
    }
}

impl fmt::Display for Position {
    /// `dir/web.yaml:14 (document 2): items[3]`, each part after the file only when known.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(document) = self.document {
            write!(f, " (document {document})")?;
        }
        if let Some(item) = self.item {
            write!(f, ": items[{item}]")?;
        }
        Ok(())
    }
}

/// A problem with the manifests. Each displays as one line naming the file.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ManifestError {
    #[error("{}: cannot list directory: {source}", .path.display())]
    ListDirectory { path: PathBuf, source: Arc<io::Error> },
    #[error("{}: cannot read file: {source}", .path.display())]
    ReadFile { path: PathBuf, source: Arc<io::Error> },
    /// The document is not valid YAML / JSON, or not a valid object of its kind.
    #[error("{position}: {}{reason}", object_and_field(.object.as_ref(), .field.as_deref()))]
    ParseDocument { position: Position, object: Option<ObjectRef>, field: Option<String>, reason: String },
    #[error("{position}: {kind}: metadata.name: required")]
    MissingName { position: Position, kind: ObjectKind },
    #[error("{position}: {object}: defined again; the definition at {first} is kept")]
    DuplicateObject { position: Position, object: ObjectRef, first: Position },
}

impl ManifestError {
    /// The file or directory the problem is in.
    pub fn path(&self) -> &Path {
        match self {
            ManifestError::ListDirectory { path, .. } | ManifestError::ReadFile { path, .. } => path,
            ManifestError::ParseDocument { position, .. }
            | ManifestError::MissingName { position, .. }
            | ManifestError::DuplicateObject { position, .. } => &position.file,
        }
    }
}

fn object_and_field(object: Option<&ObjectRef>, field: Option<&str>) -> String {
    let mut prefix = String::new();
    if let Some(object) = object {
        prefix = format!("{object}: ");
    }
    if let Some(field) = field {
        prefix.push_str(field);
        prefix.push_str(": ");
    }
    prefix
}

/// Loads every manifest under `dir`. Never fails as a whole: problems are in
/// [`Loaded::errors`], and everything that could be read is in [`Loaded::objects`].
pub fn load_directory(dir: &Path) -> Loaded {
    let mut listing_errors = Vec::new();
    let files = list_files(dir, &mut listing_errors);
    let parsed = read_and_parse(files.into_iter().map(|file| file.path).collect());
    let mut assembler = Assembler::default();
    for error in listing_errors {
        assembler.add_error(error);
    }
    for (_, contents) in parsed {
        assembler.add_file(contents.objects, contents.errors);
    }
    let loaded = assembler.finish();
    debug!(
        dir = %dir.display(),
        services = loaded.objects.services.len(),
        pods = loaded.objects.pods.len(),
        nodes = loaded.objects.nodes.len(),
        slices = loaded.objects.slices.len(),
        errors = loaded.errors.len(),
        "loaded manifests"
    );
    loaded
}

/// A manifest file found by the directory walk.
#[derive(Debug, Clone)]
pub(crate) struct ManifestFile {
    pub(crate) path: PathBuf,
    pub(crate) fingerprint: Fingerprint,
}

/// What tells one version of a file from the next without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    len: u64,
    modified_ns: i128,
    #[cfg(unix)]
    device: u64,
    #[cfg(unix)]
    inode: u64,
    #[cfg(unix)]
    changed_ns: i128,
}

impl Fingerprint {
    fn of(meta: &fs::Metadata) -> Self {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            Self {
                len: meta.len(),
                modified_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
                device: meta.dev(),
                inode: meta.ino(),
                changed_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
            }
        }
        #[cfg(not(unix))]
        {
            let modified_ns = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos() as i128);
            Self { len: meta.len(), modified_ns }
        }
    }
}

fn is_manifest_name(name: &OsStr) -> bool {
    let Some(extension) = Path::new(name).extension().and_then(OsStr::to_str) else {
        return false;
    };
    ["yaml", "yml", "json"].iter().any(|known| extension.eq_ignore_ascii_case(known))
}

fn is_hidden(name: &OsStr) -> bool {
    name.as_encoded_bytes().starts_with(b".")
}

/// The manifest files under `dir`, sorted by path. Symbolic links are followed; a directory
/// reached twice (a link loop) is walked once.
pub(crate) fn list_files(dir: &Path, errors: &mut Vec<ManifestError>) -> Vec<ManifestFile> {
    let mut files = Vec::new();
    let mut visited = HashSet::new();
    if let Ok(canonical) = fs::canonicalize(dir) {
        visited.insert(canonical);
    }
    walk(dir, 0, &mut visited, &mut files, errors);
    files.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    files
}

fn walk(
    dir: &Path,
    depth: usize,
    visited: &mut HashSet<PathBuf>,
    files: &mut Vec<ManifestFile>,
    errors: &mut Vec<ManifestError>,
) {
    let list_error = |source| ManifestError::ListDirectory { path: dir.to_path_buf(), source: Arc::new(source) };
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(source) => {
            errors.push(list_error(source));
            return;
        }
    };
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(source) => {
                errors.push(list_error(source));
                break;
            }
        };
        let name = entry.file_name();
        if is_hidden(&name) {
            continue;
        }
        let path = entry.path();
        let meta = match fs::metadata(&path) {
            Ok(meta) => meta,
            Err(source) => {
                let is_link = entry.file_type().is_ok_and(|t| t.is_symlink());
                // A file removed since the listing is simply gone; a broken link to a
                // manifest is worth a word.
                if is_manifest_name(&name) && (is_link || source.kind() != io::ErrorKind::NotFound) {
                    errors.push(ManifestError::ReadFile { path, source: Arc::new(source) });
                }
                continue;
            }
        };
        if meta.is_dir() {
            if depth >= MAX_DIRECTORY_DEPTH {
                debug!(dir = %path.display(), "not descending further: directory nesting too deep");
                continue;
            }
            let first_visit = fs::canonicalize(&path).map_or(true, |canonical| visited.insert(canonical));
            if first_visit {
                walk(&path, depth + 1, visited, files, errors);
            }
        } else if meta.is_file() && is_manifest_name(&name) {
            files.push(ManifestFile { path, fingerprint: Fingerprint::of(&meta) });
        }
    }
}

/// What one file yielded.
#[derive(Debug, Clone, Default)]
pub(crate) struct FileContents {
    pub(crate) objects: Vec<ParsedObject>,
    pub(crate) errors: Vec<ManifestError>,
}

/// One object read from a file, with where it was.
#[derive(Debug, Clone)]
pub(crate) struct ParsedObject {
    pub(crate) object: AnyObject,
    pub(crate) position: Position,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AnyObject {
    // Boxed: the k8s-openapi structs are kilobytes each, and of very different sizes.
    Service(Box<Service>),
    /// Read straight into the compact record (see `held`).
    Pod(Box<PodRecord>),
    Node(Box<Node>),
    Slice(Box<EndpointSlice>),
    Pool(Box<LoadBalancerIPPool>),
}

impl AnyObject {
    pub(crate) fn kind(&self) -> ObjectKind {
        match self {
            AnyObject::Service(_) => ObjectKind::Service,
            AnyObject::Pod(_) => ObjectKind::Pod,
            AnyObject::Node(_) => ObjectKind::Node,
            AnyObject::Slice(_) => ObjectKind::EndpointSlice,
            AnyObject::Pool(_) => ObjectKind::LoadBalancerIPPool,
        }
    }

    /// The metadata of every kind but Pods (whose record keeps name and namespace only).
    fn metadata_mut(&mut self) -> Option<&mut ObjectMeta> {
        match self {
            AnyObject::Service(o) => Some(&mut o.metadata),
            AnyObject::Pod(_) => None,
            AnyObject::Node(o) => Some(&mut o.metadata),
            AnyObject::Slice(o) => Some(&mut o.metadata),
            AnyObject::Pool(o) => Some(&mut o.metadata),
        }
    }

    fn name(&self) -> Option<&str> {
        match self {
            AnyObject::Service(o) => o.metadata.name.as_deref(),
            AnyObject::Pod(o) => Some(o.name()),
            AnyObject::Node(o) => o.metadata.name.as_deref(),
            AnyObject::Slice(o) => o.metadata.name.as_deref(),
            AnyObject::Pool(o) => o.metadata.name.as_deref(),
        }
    }

    pub(crate) fn as_node(&self) -> Option<&Node> {
        if let AnyObject::Node(o) = self { Some(o) } else { None }
    }

    pub(crate) fn as_slice(&self) -> Option<&EndpointSlice> {
        if let AnyObject::Slice(o) = self { Some(o) } else { None }
    }

    pub(crate) fn as_pool(&self) -> Option<&LoadBalancerIPPool> {
        if let AnyObject::Pool(o) = self { Some(o) } else { None }
    }

    pub(crate) fn reference(&self) -> ObjectRef {
        match self {
            AnyObject::Pod(pod) => {
                let namespace = Some(pod.namespace()).filter(|ns| !ns.is_empty()).unwrap_or(DEFAULT_NAMESPACE);
                ObjectRef::new(ObjectKind::Pod, namespace, pod.name())
            }
            AnyObject::Service(o) => ObjectRef::from_meta(ObjectKind::Service, &o.metadata),
            AnyObject::Node(o) => ObjectRef::from_meta(ObjectKind::Node, &o.metadata),
            AnyObject::Slice(o) => ObjectRef::from_meta(ObjectKind::EndpointSlice, &o.metadata),
            AnyObject::Pool(o) => ObjectRef::from_meta(ObjectKind::LoadBalancerIPPool, &o.metadata),
        }
    }
}

/// Builds a [`Loaded`] from files in path order: first definition wins.
#[derive(Debug, Default)]
pub(crate) struct Assembler {
    loaded: Loaded,
}

impl Assembler {
    pub(crate) fn add_error(&mut self, error: ManifestError) {
        self.loaded.errors.push(error);
    }

    /// Adds one file's objects and errors; call in path order.
    pub(crate) fn add_file(
        &mut self,
        objects: impl IntoIterator<Item = ParsedObject>,
        errors: impl IntoIterator<Item = ManifestError>,
    ) {
        self.loaded.errors.extend(errors);
        for parsed in objects {
            self.add_object(parsed);
        }
    }

    pub(crate) fn add_object(&mut self, parsed: ParsedObject) {
        match self.loaded.origins.positions.entry(parsed.object.reference()) {
            Entry::Occupied(first) => {
                self.loaded.errors.push(ManifestError::DuplicateObject {
                    object: first.key().clone(),
                    first: first.get().clone(),
                    position: parsed.position,
                });
                return;
            }
            Entry::Vacant(slot) => {
                slot.insert(parsed.position);
            }
        }
        let objects = &mut self.loaded.objects;
        match parsed.object {
            AnyObject::Service(o) => objects.services.push(*o),
            AnyObject::Pod(o) => objects.pods.push(o.to_pod()),
            AnyObject::Node(o) => objects.nodes.push(*o),
            AnyObject::Slice(o) => objects.slices.push(*o),
            AnyObject::Pool(o) => objects.pools.push(*o),
        }
    }

    pub(crate) fn finish(self) -> Loaded {
        self.loaded
    }
}

/// Reads and parses files (in parallel when there is much to parse), keeping their order.
/// A file that cannot be read yields one error.
pub(crate) fn read_and_parse(paths: Vec<PathBuf>) -> Vec<(Arc<Path>, FileContents)> {
    let mut files: Vec<(Arc<Path>, FileContents)> = Vec::with_capacity(paths.len());
    let mut texts: Vec<(usize, String)> = Vec::with_capacity(paths.len());
    for path in paths {
        let mut contents = FileContents::default();
        match fs::read_to_string(&path) {
            Ok(text) => texts.push((files.len(), text)),
            Err(source) => {
                contents.errors.push(ManifestError::ReadFile { path: path.clone(), source: Arc::new(source) });
            }
        }
        files.push((Arc::from(path), contents));
    }

    let mut work = Vec::new();
    for (file, text) in &texts {
        push_work(&mut work, *file, is_json(&files[*file].0), text);
    }

    let paths: Vec<Arc<Path>> = files.iter().map(|(path, _)| Arc::clone(path)).collect();
    for (file, parsed) in parse_work(&work, &paths) {
        let contents = &mut files[file].1;
        contents.objects.extend(parsed.objects);
        contents.errors.extend(parsed.errors);
    }
    files
}

/// Parses the text of one manifest file as if it had been read from `path` (whose extension
/// decides JSON or YAML, as for [`load_directory`]); nothing is read from disk. The same
/// parsing as [`load_directory`], for one file: used by the fuzz target and by tests.
pub fn parse_manifest_text(path: &Path, text: &str) -> Loaded {
    let file: Arc<Path> = Arc::from(path);
    let mut work = Vec::new();
    push_work(&mut work, 0, is_json(path), text);
    let mut assembler = Assembler::default();
    for (_, contents) in parse_work(&work, &[file]) {
        assembler.add_file(contents.objects, contents.errors);
    }
    assembler.finish()
}

/// Splits the text of file number `file` into work units: the whole text for JSON, one unit
/// per document for YAML.
pub(crate) fn push_work<'a>(work: &mut Vec<Work<'a>>, file: usize, json: bool, text: &'a str) {
    if json {
        work.push(Work { file, unit: Unit::Json(text) });
        return;
    }
    let documents = split_documents(text);
    let numbered = documents.len() > 1;
    for (index, document) in documents.into_iter().enumerate() {
        let index = numbered.then_some(index + 1);
        work.push(Work { file, unit: Unit::Yaml { document, index } });
    }
}

pub(crate) fn is_json(path: &Path) -> bool {
    path.extension().and_then(OsStr::to_str).is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

/// One piece of parsing: a YAML document or a whole JSON file.
#[derive(Debug)]
pub(crate) struct Work<'a> {
    pub(crate) file: usize,
    pub(crate) unit: Unit<'a>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Unit<'a> {
    Yaml { document: Document<'a>, index: Option<usize> },
    Json(&'a str),
}

impl<'a> Work<'a> {
    fn len(&self) -> usize {
        match &self.unit {
            Unit::Yaml { document, .. } => document.text.len(),
            Unit::Json(text) => text.len(),
        }
    }

    fn parse(&self, path: &Arc<Path>, scratch: &mut simple_yaml::Scratch<'a>) -> FileContents {
        let mut out = FileContents::default();
        match &self.unit {
            Unit::Yaml { document, index } => parse_yaml_document(path, document, *index, &mut out, scratch),
            Unit::Json(text) => parse_json_file(path, text, &mut out),
        }
        out
    }
}

/// Parses the work units, on several threads when there is enough text, and returns the
/// results in the order of `work`, tagged with their file index.
pub(crate) fn parse_work(work: &[Work<'_>], paths: &[Arc<Path>]) -> Vec<(usize, FileContents)> {
    let total: usize = work.iter().map(Work::len).sum();
    let threads = std::thread::available_parallelism()
        .map_or(1, NonZeroUsize::get)
        .min(MAX_PARSE_THREADS)
        .min(total / PARALLEL_PARSE_THRESHOLD + 1);
    let parse_chunk = |chunk: &[Work<'_>]| -> Vec<(usize, FileContents)> {
        let mut scratch = simple_yaml::Scratch::default();
        chunk.iter().map(|w| (w.file, w.parse(&paths[w.file], &mut scratch))).collect()
    };
    if threads <= 1 {
        return parse_chunk(work);
    }

    // Contiguous chunks of about equal text, so the results concatenate in order.
    let target = total.div_ceil(threads);
    let mut chunks = Vec::with_capacity(threads);
    let (mut start, mut size) = (0, 0);
    for (i, w) in work.iter().enumerate() {
        size += w.len();
        if size >= target {
            chunks.push(&work[start..=i]);
            (start, size) = (i + 1, 0);
        }
    }
    if start < work.len() {
        chunks.push(&work[start..]);
    }

    std::thread::scope(|scope| {
        let handles: Vec<_> = chunks.into_iter().map(|chunk| scope.spawn(move || parse_chunk(chunk))).collect();
        let mut results = Vec::with_capacity(work.len());
        for handle in handles {
            match handle.join() {
                Ok(part) => results.extend(part),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        results
    })
}

/// One YAML document of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Document<'a> {
    pub(crate) text: &'a str,
    /// 1-based line of the file where `text` starts (parser lines count from here).
    first_line: u64,
    /// 1-based line of the file where the document's content starts (past leading
    /// comments and markers): where errors about the whole document point.
    pub(crate) content_line: u64,
}

/// Splits a YAML stream into its documents at `---` and `...` lines. Chunks with nothing but
/// comments, blank lines and directives are not documents; they join the next one (so a
/// leading `---` or `%YAML` line does not count as a document).
pub(crate) fn split_documents(text: &str) -> Vec<Document<'_>> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut documents = Vec::new();
    // The chunk being collected, and the line of its first content if it has any.
    let (mut start, mut first_line, mut content_line) = (0, 1, None);
    let mut offset = 0;
    for (line_number, line) in (1u64..).zip(text.split_inclusive('\n')) {
        let bare = line.trim_end_matches(['\n', '\r']);
        if is_document_start(bare) {
            if let Some(content_line) = content_line {
                documents.push(Document { text: &text[start..offset], first_line, content_line });
                (start, first_line) = (offset, line_number);
            }
            // `--- {a: 1}` or `--- |` carries content on the marker line itself.
            let rest = bare[3..].trim();
            content_line = (!rest.is_empty() && !rest.starts_with('#')).then_some(line_number);
        } else if bare == "..." || bare.starts_with("... ") {
            if let Some(content_line) = content_line {
                documents.push(Document { text: &text[start..offset], first_line, content_line });
            }
            (start, first_line, content_line) = (offset + line.len(), line_number + 1, None);
        } else if content_line.is_none() {
            let trimmed = bare.trim_start();
            let is_content = !(trimmed.is_empty() || trimmed.starts_with('#') || bare.starts_with('%'));
            content_line = is_content.then_some(line_number);
        }
        offset += line.len();
    }
    if let Some(content_line) = content_line {
        documents.push(Document { text: &text[start..], first_line, content_line });
    }
    documents
}

fn is_document_start(line: &str) -> bool {
    line.strip_prefix("---").is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
}

/// `apiVersion`, `kind` and the object's name: enough to dispatch a document and to name it
/// in an error.
#[derive(Debug, Default, Deserialize)]
struct Header {
    #[serde(rename = "apiVersion", default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: Option<HeaderMetadata>,
}

#[derive(Debug, Default, Deserialize)]
struct HeaderMetadata {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
}

impl Header {
    fn object_ref(&self, kind: ObjectKind) -> Option<ObjectRef> {
        let metadata = self.metadata.as_ref()?;
        let meta =
            ObjectMeta { name: metadata.name.clone(), namespace: metadata.namespace.clone(), ..ObjectMeta::default() };
        metadata.name.is_some().then(|| ObjectRef::from_meta(kind, &meta))
    }
}

/// What a document is, by its `apiVersion` and `kind`.
enum Class {
    Object(ObjectKind),
    /// A `List` (items carry their own kind) or a typed list such as `ServiceList` (items
    /// may omit it).
    List(Option<ObjectKind>),
    Other,
}

fn classify(api_version: &str, kind: &str) -> Class {
    if let Some(kind) = ObjectKind::from_type_meta(api_version, kind) {
        Class::Object(kind)
    } else if kind == "List" {
        Class::List(None)
    } else if let Some(kind) = ObjectKind::of_typed_list(api_version, kind) {
        Class::List(Some(kind))
    } else {
        Class::Other
    }
}

/// Why a document did not parse.
#[derive(Debug)]
struct Failure {
    field: Option<String>,
    reason: String,
    /// Line within the parsed text, 1-based.
    line: Option<u64>,
}

impl Failure {
    fn into_error(self, mut position: Position, first_line: u64, object: Option<ObjectRef>) -> ManifestError {
        if let Some(line) = self.line {
            position.line = Some(first_line + line - 1);
        }
        ManifestError::ParseDocument { position, object, field: self.field, reason: self.reason }
    }
}

/// The path of the field a deserialization error is about, without the `?` segments that
/// stand for keys not known yet (a duplicate key, for one).
fn field_path(path: &serde_path_to_error::Path) -> Option<String> {
    let mut path = path.to_string();
    while let Some(parent) = path.strip_suffix(".?") {
        path.truncate(parent.len());
    }
    (path != "." && path != "?").then_some(path)
}

fn yaml_options(len: usize) -> serde_saphyr::Options {
    // The default budget suits configuration files; a `List` of thousands of objects in one
    // document is legitimate here, so the limits grow with the input.
    let mut budget = serde_saphyr::Budget::default();
    budget.max_events = budget.max_events.max(len);
    budget.max_nodes = budget.max_nodes.max(len);
    budget.max_total_scalar_bytes = budget.max_total_scalar_bytes.max(len);
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options.with_snippet = false;
    options.emit_comments = false;
    options
}

fn parse_yaml<T: DeserializeOwned>(text: &str) -> Result<T, Failure> {
    let mut field = None;
    serde_saphyr::with_deserializer_from_str_with_options(text, yaml_options(text.len()), |deserializer| {
        serde_path_to_error::deserialize(deserializer).map_err(|error| {
            field = field_path(error.path());
            error.into_inner()
        })
    })
    .map_err(|error| {
        let location = error.location();
        let mut reason = error.to_string();
        if let Some(location) = location {
            let suffix = format!(" at line {}, column {}", location.line(), location.column());
            if let Some(stripped) = reason.strip_suffix(&suffix) {
                reason.truncate(stripped.len());
            }
        }
        // A hint meant for the programmer, not for whoever wrote the manifest.
        if let Some(stripped) = reason.strip_suffix(", set DuplicateKeyPolicy in Options if acceptable") {
            reason.truncate(stripped.len());
        }
        if reason.contains('\n') {
            reason = reason.split_whitespace().collect::<Vec<_>>().join(" ");
        }
        Failure { field, reason, line: location.map(|l| l.line()).filter(|&line| line > 0) }
    })
}

fn decode_value<T: DeserializeOwned>(value: Value) -> Result<T, Failure> {
    serde_path_to_error::deserialize(value).map_err(|error| Failure {
        field: field_path(error.path()),
        reason: error.into_inner().to_string(),
        line: None,
    })
}

/// Finds top-level `apiVersion:` and `kind:` lines without parsing the document. Parsing
/// YAML costs as much as the whole object does, so dispatching on a full parse would double
/// the load time. Returns `None` (parse properly) when either is missing, repeated, or not
/// a plain word.
fn scan_type_meta(text: &str) -> Option<(&str, &str)> {
    let (mut api_version, mut kind) = (None, None);
    for line in text.lines() {
        let (slot, rest) = if let Some(rest) = line.strip_prefix("apiVersion:") {
            (&mut api_version, rest)
        } else if let Some(rest) = line.strip_prefix("kind:") {
            (&mut kind, rest)
        } else {
            continue;
        };
        if slot.is_some() || !(rest.is_empty() || rest.starts_with([' ', '\t'])) {
            return None;
        }
        *slot = Some(plain_word(rest)?);
    }
    Some((api_version?, kind?))
}

/// The value of `key: value  # comment`, unquoted, when it is a simple word.
fn plain_word(rest: &str) -> Option<&str> {
    let mut value = rest.trim();
    if let Some(comment) = value.find(" #").or_else(|| value.find("\t#")) {
        value = value[..comment].trim_end();
    }
    for quote in ['"', '\''] {
        if let Some(inner) = value.strip_prefix(quote).and_then(|v| v.strip_suffix(quote)) {
            value = inner;
            break;
        }
    }
    let is_word = !value.is_empty() && value.bytes().all(|b| b.is_ascii_alphanumeric() || b"./-_".contains(&b));
    is_word.then_some(value)
}

fn parse_yaml_document<'a>(
    file: &Arc<Path>,
    document: &Document<'a>,
    index: Option<usize>,
    out: &mut FileContents,
    scratch: &mut simple_yaml::Scratch<'a>,
) {
    let position = Position { document: index, line: Some(document.content_line), ..Position::file(file) };
    // Errors point at the document's first line unless the parser knows better.
    let error_position = position.clone();
    let text = document.text;

    let (api_version, kind) = match scan_type_meta(text) {
        Some((api_version, kind)) => (api_version.to_owned(), kind.to_owned()),
        None => match parse_yaml::<Option<Header>>(text) {
            Ok(None) => return,
            Ok(Some(Header { api_version: Some(api_version), kind: Some(kind), .. })) => (api_version, kind),
            Ok(Some(_)) => {
                out.errors.push(not_an_object(error_position));
                return;
            }
            Err(failure) => {
                out.errors.push(failure.into_error(error_position, document.first_line, None));
                return;
            }
        },
    };

    match classify(&api_version, &kind) {
        Class::Object(kind) => {
            // Plain documents are read by the fast reader; anything it leaves, or whose value
            // does not decode, goes through the full parser (whose errors carry lines).
            if let Some(object) = decode_plain(kind, text, scratch) {
                accept(object, position, out);
                return;
            }
            match parse_object(kind, text) {
                Ok(object) => accept(object, position, out),
                Err(failure) => {
                    // Name the object if its metadata at least can be read.
                    let object = parse_yaml::<Header>(text).ok().and_then(|header| header.object_ref(kind));
                    out.errors.push(failure.into_error(error_position, document.first_line, object));
                }
            }
        }
        Class::List(item_kind) => match parse_yaml::<Value>(text) {
            Ok(list) => parse_list(list, item_kind, &position, out),
            Err(failure) => out.errors.push(failure.into_error(error_position, document.first_line, None)),
        },
        Class::Other => {
            debug!(file = %file.display(), %api_version, %kind, "ignoring an object of a kind svcplane does not use");
        }
    }
}

/// An object of `kind` from its JSON value.
/// A document read by the full YAML parser into its object; errors name the field and line.
fn parse_object(kind: ObjectKind, text: &str) -> Result<AnyObject, Failure> {
    Ok(match kind {
        ObjectKind::Service => AnyObject::Service(Box::new(parse_yaml(text)?)),
        ObjectKind::Pod => AnyObject::Pod(Box::new(parse_yaml(text)?)),
        ObjectKind::Node => AnyObject::Node(Box::new(parse_yaml(text)?)),
        ObjectKind::EndpointSlice => AnyObject::Slice(Box::new(parse_yaml(text)?)),
        ObjectKind::LoadBalancerIPPool => AnyObject::Pool(Box::new(parse_yaml(text)?)),
    })
}

/// A plain document read by the fast reader into its object, `None` when the reader gives
/// up or the object does not decode (the full parser then reads it and names the error).
fn decode_plain<'a>(kind: ObjectKind, text: &'a str, scratch: &mut simple_yaml::Scratch<'a>) -> Option<AnyObject> {
    Some(match kind {
        ObjectKind::Service => AnyObject::Service(Box::new(simple_yaml::decode(text, scratch)?)),
        ObjectKind::Pod => AnyObject::Pod(Box::new(simple_yaml::decode(text, scratch)?)),
        ObjectKind::Node => AnyObject::Node(Box::new(simple_yaml::decode(text, scratch)?)),
        ObjectKind::EndpointSlice => AnyObject::Slice(Box::new(simple_yaml::decode(text, scratch)?)),
        ObjectKind::LoadBalancerIPPool => AnyObject::Pool(Box::new(simple_yaml::decode(text, scratch)?)),
    })
}

fn decode_object(kind: ObjectKind, value: Value) -> Result<AnyObject, Failure> {
    Ok(match kind {
        ObjectKind::Service => AnyObject::Service(Box::new(decode_value(value)?)),
        ObjectKind::Pod => AnyObject::Pod(Box::new(decode_value(value)?)),
        ObjectKind::Node => AnyObject::Node(Box::new(decode_value(value)?)),
        ObjectKind::EndpointSlice => AnyObject::Slice(Box::new(decode_value(value)?)),
        ObjectKind::LoadBalancerIPPool => AnyObject::Pool(Box::new(decode_value(value)?)),
    })
}

fn not_an_object(position: Position) -> ManifestError {
    ManifestError::ParseDocument {
        position,
        object: None,
        field: None,
        reason: "not a Kubernetes object: apiVersion and kind are required".to_owned(),
    }
}

fn parse_json_file(file: &Arc<Path>, text: &str, out: &mut FileContents) {
    let mut values = Vec::new();
    for value in serde_json::Deserializer::from_str(text).into_iter::<Value>() {
        match value {
            Ok(value) => values.push(value),
            Err(error) => {
                let line = u64::try_from(error.line()).ok().filter(|&line| line > 0);
                // serde_json appends the position; it is in the error's own fields.
                let reason = error.to_string();
                let reason = reason.split(" at line ").next().unwrap_or_default().to_owned();
                let position = Position { line, ..Position::file(file) };
                out.errors.push(ManifestError::ParseDocument { position, object: None, field: None, reason });
                // The rest of a broken JSON stream cannot be trusted.
                break;
            }
        }
    }
    let numbered = values.len() > 1;
    for (index, value) in values.into_iter().enumerate() {
        let position = Position { document: numbered.then_some(index + 1), ..Position::file(file) };
        parse_value(value, None, position, out);
    }
}

/// Dispatches one object given as a JSON value: a `List` item or a JSON document.
/// `default_kind` is the item kind of a typed list, for items without `apiVersion`/`kind`.
fn parse_value(value: Value, default_kind: Option<ObjectKind>, position: Position, out: &mut FileContents) {
    let header = match Header::deserialize(&value) {
        Ok(header) => header,
        Err(error) => {
            let reason = format!("not a Kubernetes object: {error}");
            out.errors.push(ManifestError::ParseDocument { position, object: None, field: None, reason });
            return;
        }
    };
    let class = match (&header.api_version, &header.kind, default_kind) {
        (Some(api_version), Some(kind), _) => classify(api_version, kind),
        (None, None, Some(kind)) => Class::Object(kind),
        _ => {
            out.errors.push(not_an_object(position));
            return;
        }
    };
    match class {
        Class::Object(kind) => match decode_object(kind, value) {
            Ok(object) => accept(object, position, out),
            Err(failure) => out.errors.push(failure.into_error(position, 1, header.object_ref(kind))),
        },
        Class::List(item_kind) => parse_list(value, item_kind, &position, out),
        Class::Other => debug!(
            file = %position.file.display(),
            api_version = header.api_version.as_deref().unwrap_or_default(),
            kind = header.kind.as_deref().unwrap_or_default(),
            "ignoring an object of a kind svcplane does not use"
        ),
    }
}

fn parse_list(mut list: Value, item_kind: Option<ObjectKind>, position: &Position, out: &mut FileContents) {
    let items = list.as_object_mut().and_then(|fields| fields.remove("items")).unwrap_or(Value::Null);
    let items = match items {
        Value::Array(items) => items,
        Value::Null => Vec::new(),
        _ => {
            out.errors.push(ManifestError::ParseDocument {
                position: position.clone(),
                object: None,
                field: Some("items".to_owned()),
                reason: "expected a list of objects".to_owned(),
            });
            return;
        }
    };
    for (index, item) in items.into_iter().enumerate() {
        let item_position = Position { item: Some(index), line: None, ..position.clone() };
        parse_value(item, item_kind, item_position, out);
    }
}

/// Checks the name, defaults the namespace and keeps the object.
fn accept(mut object: AnyObject, position: Position, out: &mut FileContents) {
    let kind = object.kind();
    if object.name().is_none_or(str::is_empty) {
        out.errors.push(ManifestError::MissingName { position, kind });
        return;
    }
    match object.metadata_mut() {
        Some(meta) if !kind.is_namespaced() => meta.namespace = None,
        Some(meta) if meta.namespace.as_deref().is_none_or(str::is_empty) => {
            meta.namespace = Some(DEFAULT_NAMESPACE.to_owned());
        }
        Some(_) => {}
        None => {
            if let AnyObject::Pod(pod) = &mut object
                && pod.namespace().is_empty()
            {
                pod.set_namespace(DEFAULT_NAMESPACE);
            }
        }
    }
    out.objects.push(ParsedObject { object, position });
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh directory under the system temp dir, removed on drop.
    #[derive(Debug)]
    pub(crate) struct TempDir(pub(crate) PathBuf);

    impl TempDir {
        pub(crate) fn new(label: &str) -> Self {
            static COUNTER: AtomicUsize = AtomicUsize::new(0);
            let unique =
                format!("svcplane-source-{label}-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
            let path = std::env::temp_dir().join(unique);
            let _ = fs::remove_dir_all(&path);
            fs::create_dir_all(&path).unwrap();
            Self(path)
        }

        pub(crate) fn write(&self, name: &str, text: &str) -> PathBuf {
            let path = self.0.join(name);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).unwrap();
            }
            fs::write(&path, text).unwrap();
            path
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn messages(loaded: &Loaded) -> Vec<String> {
        loaded.errors.iter().map(ToString::to_string).collect()
    }

    fn names<T>(objects: &[T], meta: impl Fn(&T) -> &ObjectMeta) -> Vec<String> {
        objects.iter().map(|o| meta(o).name.clone().unwrap_or_default()).collect()
    }

    const WEB_AND_PODS: &str = "\
# the web tier
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  clusterIP: 198.19.0.10
  ports:
  - name: http
    port: 80
---
apiVersion: v1
kind: Pod
metadata:
  name: web-1
  namespace: shop
spec:
  nodeName: node-1
  containers: [{name: app, image: app}]
---
apiVersion: v1
kind: Pod
metadata: {name: web-2}
spec:
  containers: [{name: app, image: app}]
";

    #[test]
    fn object_names_short_or_long_compare_order_and_hash_as_their_text() {
        use std::hash::{BuildHasher, RandomState};
        let names = [
            "",
            "a",
            "svc-9999-9",
            "exactly-twenty-two-abc",
            "twenty-three-characters",
            "é-ünïcode-näme-über-22-bytes",
        ];
        let hasher = RandomState::new();
        for a in names {
            let name = ObjectName::new(a);
            assert_eq!(name.as_str(), a);
            assert_eq!(name.to_string(), a);
            assert_eq!(format!("{name:?}"), format!("{a:?}"));
            assert_eq!(hasher.hash_one(&name), hasher.hash_one(a), "{a}");
            for b in names {
                assert_eq!(name.cmp(&ObjectName::new(b)), a.cmp(b), "{a} against {b}");
            }
        }
        assert_eq!("exactly-twenty-two-abc".len(), INLINE_NAME);
        assert!(matches!(ObjectName::new("exactly-twenty-two-abc").0, NameText::Inline { .. }));
        assert!(matches!(ObjectName::new("twenty-three-characters").0, NameText::Boxed(_)));
        assert!(
            size_of::<ObjectRef>() <= 48,
            "{} bytes: an Arc of it then fits an 80-byte chunk",
            size_of::<ObjectRef>()
        );
    }

    #[test]
    fn a_plain_document_read_by_the_fast_reader_is_the_object_the_yaml_parser_reads() {
        let service = "apiVersion: v1\nkind: Service\nmetadata:\n  name: svc-1\n  namespace: bench\nspec:\n  type: NodePort\n  clusterIP: 198.19.0.16\n  selector:\n    app: svc-1\n  ports:\n    - name: http\n      protocol: TCP\n      port: 80\n      targetPort: 8080\n    - name: named\n      port: 81\n      targetPort: http\n";
        let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: svc-1-0\n  namespace: bench\n  uid: u-1\n  labels:\n    app: svc-1\n  deletionTimestamp: 2026-01-01T00:00:00Z\nspec:\n  nodeName: node2\n  hostname: a\n  containers:\n  - name: app\n    image: bench\n    ports:\n    - name: http\n      containerPort: 8080\nstatus:\n  phase: Running\n  podIP: 198.18.160.1\n  podIPs:\n    - ip: 198.18.160.1\n  conditions:\n    - type: Ready\n      status: \"True\"\n";
        let slice = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  labels:\n    kubernetes.io/service-name: web\naddressType: IPv4\nports:\n  - port: 8080\nendpoints:\n  - addresses:\n      - 198.18.0.2\n    conditions:\n      ready: true\n";
        let service_fast = decode_plain(ObjectKind::Service, service, &mut simple_yaml::Scratch::default()).unwrap();
        let service_full = AnyObject::Service(Box::new(parse_yaml(service).unwrap()));
        assert_eq!(service_fast, service_full);
        let pod_fast = decode_plain(ObjectKind::Pod, pod, &mut simple_yaml::Scratch::default()).unwrap();
        let pod_full = AnyObject::Pod(Box::new(parse_yaml(pod).unwrap()));
        assert_eq!(pod_fast, pod_full);
        let slice_fast = decode_plain(ObjectKind::EndpointSlice, slice, &mut simple_yaml::Scratch::default()).unwrap();
        let slice_full = AnyObject::Slice(Box::new(parse_yaml(slice).unwrap()));
        assert_eq!(slice_fast, slice_full);
    }

    #[test]
    fn nulls_empty_values_negative_numbers_enums_and_unknown_fields_decode_as_the_yaml_parser_reads_them() {
        let documents = [
            (
                ObjectKind::Service,
                "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  annotations: {}\n  labels:\n    b: '2'\n    a: \"1\"\nspec:\n  type: LoadBalancer\n  clusterIP:\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 30999\n  sessionAffinity: ClientIP\n  sessionAffinityConfig:\n    clientIP:\n      timeoutSeconds: 60\n  ports:\n  - port: 80\n    protocol: UDP\n  unknownField: ~\nstatus:\n  loadBalancer:\n    ingress:\n    - ip: 198.18.100.1\n",
            ),
            (
                ObjectKind::Node,
                "apiVersion: v1\nkind: Node\nmetadata:\n  name: node1\n  labels:\n    topology.kubernetes.io/zone: a\nspec:\n  unschedulable: true\n  podCIDRs: []\nstatus:\n  addresses:\n  - type: InternalIP\n    address: 198.18.0.11\n",
            ),
            (
                ObjectKind::LoadBalancerIPPool,
                "apiVersion: svcplane.io/v1alpha1\nkind: LoadBalancerIPPool\nmetadata:\n  name: lan\nspec:\n  blocks:\n  - start: 198.18.0.224\n    stop: 198.18.0.225\n",
            ),
            (
                ObjectKind::Pod,
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: app\n    ports:\n    - containerPort: 80\n      hostPort: -1\nstatus:\n  podIP:\n",
            ),
        ];
        for (kind, text) in documents {
            let full = parse_object(kind, text).unwrap_or_else(|failure| panic!("{text}: {}", failure.reason));
            assert_eq!(decode_plain(kind, text, &mut simple_yaml::Scratch::default()), Some(full), "{text}");
        }
    }

    #[test]
    fn a_plain_document_that_does_not_decode_is_left_to_the_yaml_parser() {
        for text in [
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  ports:\n    - port: eighty\n",
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  ports:\n    - port: 99999999999\n",
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: 7\n",
        ] {
            assert!(simple_yaml::is_plain(text), "{text}");
            assert_eq!(decode_plain(ObjectKind::Service, text, &mut simple_yaml::Scratch::default()), None, "{text}");
        }
    }

    #[test]
    fn a_plain_document_with_a_wrong_type_still_gets_the_yaml_parser_s_error_with_its_line() {
        let text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  ports:\n    - name: http\n      port: eighty\n";
        assert!(simple_yaml::is_plain(text), "plain enough for the fast reader");
        let loaded = parse_manifest_text(Path::new("web.yaml"), text);
        let messages = messages(&loaded);
        assert_eq!(messages.len(), 1, "{messages:?}");
        assert!(messages[0].starts_with("web.yaml:8"), "{messages:?}");
        assert!(messages[0].contains("Service default/web"), "{messages:?}");
        assert!(messages[0].contains("spec.ports[0].port"), "{messages:?}");
    }

    #[test]
    fn one_file_s_text_parses_as_the_same_file_loaded_from_a_directory_does() {
        let dir = TempDir::new("text");
        let broken =
            format!("{WEB_AND_PODS}---\napiVersion: v1\nkind: Service\nmetadata: {{name: bad}}\nspec: {{ports: 7}}\n");
        let path = dir.write("web.yaml", &broken);
        let from_disk = load_directory(&dir.0);
        let from_text = parse_manifest_text(&path, &broken);
        assert_eq!(messages(&from_text), messages(&from_disk));
        assert_eq!(messages(&from_text).len(), 1, "{:?}", messages(&from_text));
        assert_eq!(names(&from_text.objects.services, |o| &o.metadata), ["web"]);
        assert_eq!(names(&from_text.objects.pods, |o| &o.metadata), ["web-1", "web-2"]);
        let web = ObjectRef::new(ObjectKind::Service, DEFAULT_NAMESPACE, "web");
        assert_eq!(from_text.origins.position_of(&web), from_disk.origins.position_of(&web));
        assert_eq!(from_text.origins.len(), from_disk.origins.len());
    }

    #[test]
    fn multi_document_yaml_with_a_service_and_pods_loads_all() {
        let dir = TempDir::new("multidoc");
        let file = dir.write("web.yaml", WEB_AND_PODS);
        let loaded = load_directory(&dir.0);
        assert_eq!(messages(&loaded), Vec::<String>::new());
        assert_eq!(names(&loaded.objects.services, |o| &o.metadata), ["web"]);
        assert_eq!(names(&loaded.objects.pods, |o| &o.metadata), ["web-1", "web-2"]);
        let namespaces: Vec<_> = loaded.objects.pods.iter().map(|p| p.metadata.namespace.clone().unwrap()).collect();
        assert_eq!(namespaces, ["shop", "default"]);
        let web = ObjectRef::new(ObjectKind::Service, "default", "web");
        assert_eq!(loaded.origins.file_of(&web), Some(file.as_path()));
        assert_eq!(loaded.origins.position_of(&web).unwrap().to_string(), format!("{}:2 (document 1)", file.display()));
    }

    #[test]
    fn a_broken_document_is_reported_with_its_file_and_the_others_still_load() {
        let dir = TempDir::new("broken");
        let broken = WEB_AND_PODS.replace("  - name: http\n    port: 80", "  - name: http\n    port: eighty");
        dir.write("a.yaml", &broken);
        dir.write("b.yaml", "kind: Service\napiVersion: v1\nmetadata: {name: api}\nspec: {ports: [\n");
        dir.write("c.yml", "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-1\n  namespace: ignored\n");
        let loaded = load_directory(&dir.0);
        let errors = messages(&loaded);
        assert_eq!(errors.len(), 2, "{errors:?}");
        let a = dir.0.join("a.yaml").display().to_string();
        assert_eq!(errors[0], format!("{a}:10 (document 1): Service default/web: spec.ports[0].port: invalid i32"));
        assert!(errors[1].starts_with(&format!("{}:4: spec.ports: ", dir.0.join("b.yaml").display())), "{errors:?}");
        assert_eq!(names(&loaded.objects.pods, |o| &o.metadata), ["web-1", "web-2"]);
        assert!(loaded.objects.services.is_empty());
        assert_eq!(names(&loaded.objects.nodes, |o| &o.metadata), ["node-1"]);
        assert_eq!(loaded.objects.nodes[0].metadata.namespace, None);
    }

    #[test]
    fn a_list_in_json_loads() {
        let dir = TempDir::new("jsonlist");
        dir.write(
            "all.json",
            r#"{"apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop"},
                 "spec": {"clusterIP": "198.19.0.10", "ports": [{"port": 80}]}},
                {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                 "metadata": {"name": "web-abc", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
                 "addressType": "IPv4", "endpoints": [{"addresses": ["198.18.0.2"]}], "ports": [{"port": 8080}]},
                {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}},
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "bad"}, "spec": {"ports": [{"port": "x"}]}}
            ]}"#,
        );
        dir.write(
            "nodes.yaml",
            "apiVersion: v1\nkind: NodeList\nitems:\n- metadata: {name: node-1}\n- metadata: {name: node-2}\n",
        );
        let loaded = load_directory(&dir.0);
        assert_eq!(names(&loaded.objects.services, |o| &o.metadata), ["web"]);
        assert_eq!(names(&loaded.objects.slices, |o| &o.metadata), ["web-abc"]);
        assert_eq!(names(&loaded.objects.nodes, |o| &o.metadata), ["node-1", "node-2"]);
        let file = dir.0.join("all.json").display().to_string();
        assert_eq!(
            messages(&loaded),
            [format!(
                "{file}: items[3]: Service default/bad: spec.ports[0].port: invalid type: string \"x\", expected i32"
            )]
        );
    }

    #[test]
    fn unknown_kinds_are_ignored() {
        let dir = TempDir::new("unknown");
        dir.write(
            "mixed.yaml",
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg}\ndata: {a: b}\n---\n\
             apiVersion: serving.knative.dev/v1\nkind: Service\nmetadata: {name: knative}\n---\n\
             apiVersion: v1\nkind: Service\nmetadata: {name: web}\n",
        );
        dir.write("README.md", "not a manifest");
        dir.write(".hidden/secret.yaml", "{{{ not yaml");
        dir.write(".swap.yaml", "{{{ not yaml");
        let loaded = load_directory(&dir.0);
        assert_eq!(messages(&loaded), Vec::<String>::new());
        assert_eq!(names(&loaded.objects.services, |o| &o.metadata), ["web"]);
        assert_eq!(
            loaded.objects.services.len()
                + loaded.objects.pods.len()
                + loaded.objects.nodes.len()
                + loaded.objects.slices.len(),
            1
        );
    }

    #[test]
    fn the_first_definition_by_path_wins_and_the_second_is_reported() {
        let dir = TempDir::new("duplicate");
        dir.write(
            "b/web.yaml",
            "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {clusterIP: 198.19.0.2}\n",
        );
        dir.write("a.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {clusterIP: 198.19.0.1}\n");
        let loaded = load_directory(&dir.0);
        assert_eq!(loaded.objects.services.len(), 1);
        let spec = loaded.objects.services[0].spec.as_ref().unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("198.19.0.1"));
        assert_eq!(
            messages(&loaded),
            [format!(
                "{}:1: Service default/web: defined again; the definition at {}:1 is kept",
                dir.0.join("b/web.yaml").display(),
                dir.0.join("a.yaml").display()
            )]
        );
    }

    #[test]
    fn a_missing_name_or_kind_is_reported() {
        let dir = TempDir::new("noname");
        dir.write("x.yaml", "apiVersion: v1\nkind: Service\nmetadata: {namespace: a}\n---\nfoo: bar\n");
        let loaded = load_directory(&dir.0);
        let file = dir.0.join("x.yaml").display().to_string();
        assert_eq!(
            messages(&loaded),
            [
                format!("{file}:1 (document 1): Service: metadata.name: required"),
                format!("{file}:5 (document 2): not a Kubernetes object: apiVersion and kind are required"),
            ]
        );
    }

    #[test]
    fn a_missing_directory_is_one_error() {
        let dir = TempDir::new("missing");
        let missing = dir.0.join("nope");
        let loaded = load_directory(&missing);
        assert!(
            loaded.objects.services.is_empty()
                && loaded.objects.pods.is_empty()
                && loaded.objects.nodes.is_empty()
                && loaded.objects.slices.is_empty()
        );
        assert_eq!(loaded.errors.len(), 1);
        assert!(loaded.errors[0].to_string().starts_with(&format!("{}: cannot list directory: ", missing.display())));
    }

    #[test]
    fn documents_split_at_markers_but_not_at_leading_comments_or_directives() {
        let text = "# header\n%YAML 1.2\n---\na: 1\n--- # second\nb: 2\n...\n# trailing\n--- {c: 3}\n";
        let documents = split_documents(text);
        let summary: Vec<_> = documents.iter().map(|d| (d.first_line, d.content_line, d.text)).collect();
        assert_eq!(
            summary,
            [
                (1, 4, "# header\n%YAML 1.2\n---\na: 1\n"),
                (5, 6, "--- # second\nb: 2\n"),
                (8, 9, "# trailing\n--- {c: 3}\n")
            ]
        );
        assert!(split_documents("# only a comment\n---\n\n").is_empty());
    }

    #[test]
    fn the_type_scan_falls_back_on_anything_unusual() {
        assert_eq!(scan_type_meta("apiVersion: v1\nkind: 'Service' # c\n"), Some(("v1", "Service")));
        assert_eq!(scan_type_meta("apiVersion: v1\nkind: Service\nkind: Pod\n"), None);
        assert_eq!(scan_type_meta("{apiVersion: v1, kind: Service}"), None);
        assert_eq!(scan_type_meta("apiVersion: v1\nkind:Service\n"), None);
        assert_eq!(scan_type_meta("apiVersion: v1\nkind: !!str Service\n"), None);
    }

    #[test]
    fn flow_style_documents_are_dispatched_by_parsing() {
        let dir = TempDir::new("flow");
        dir.write("flow.yaml", "{\"apiVersion\": \"v1\", \"kind\": \"Service\", \"metadata\": {\"name\": \"web\"}}\n");
        let loaded = load_directory(&dir.0);
        assert_eq!(messages(&loaded), Vec::<String>::new());
        assert_eq!(names(&loaded.objects.services, |o| &o.metadata), ["web"]);
    }
}
