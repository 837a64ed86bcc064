//! The manifests directory held file by file, so that an edit costs what it changed.
//!
//! [`ManifestStore`] remembers, for every file, the documents it had (a hash of each
//! document's text) and the objects each defined, and for every object its definitions in
//! path order (the first wins, later ones are reported as duplicates, as
//! [`crate::load_directory`] does). Applying a re-read file re-parses only the documents
//! whose text is new; unchanged documents keep their objects and only move (line and
//! document number). The result of an apply is the list of objects whose winning
//! definition changed: added, edited or gone. Objects are held compactly ([`Held`]: Pods
//! as records of the fields the controller reads). A deleted file takes its objects with it, and
//! an object that moves from one file to another is unchanged.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fs;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::FastMap;
use crate::held::{HeldPod, Interner, ServiceRecord};
use crate::manifests::{
    AnyObject, Assembler, FileContents, Loaded, ManifestError, ObjectKind, ObjectRef, ParsedObject, Position, Unit,
    Work, is_json, parse_work, push_work,
};
use crate::named_table::{NamedTable, name_hash};

/// One object as the store holds it: a value cheap to clone (a Pod's record inline, other
/// kinds behind an `Arc`), so that the store's table holds a Pod with no allocation of
/// its own and a change can carry copies of the definitions before and after.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Held {
    /// Inline: Pods are most of the objects, and their record is a few shared pointers.
    Pod(HeldPod),
    Service(Arc<ServiceRecord>),
    Other(Arc<AnyObject>),
}

impl Held {
    /// Keeps `object` compactly (Pods lose every field the controller does not read,
    /// Services are kept as their text; both share their repeated strings through
    /// `interner`), made on this thread.
    pub(crate) fn new(object: AnyObject, interner: &mut Interner) -> Self {
        match object {
            AnyObject::Pod(pod) => Held::Pod(pod.shared(interner)),
            AnyObject::Service(service) => Held::Service(Arc::new(ServiceRecord::new(service, interner))),
            other => Held::Other(Arc::new(other)),
        }
    }

    /// The object named `reference` as the complete-read paths want it.
    pub(crate) fn to_object(&self, reference: &ObjectRef) -> AnyObject {
        match self {
            Held::Pod(pod) => AnyObject::Pod(Box::new(pod.to_record(&reference.namespace, &reference.name))),
            Held::Service(record) => AnyObject::Service(Box::new(record.service())),
            Held::Other(object) => AnyObject::clone(object),
        }
    }

    pub(crate) fn as_service(&self) -> Option<&ServiceRecord> {
        if let Held::Service(record) = self { Some(record) } else { None }
    }

    /// The Service's record, shared.
    pub(crate) fn shared_service(&self) -> Option<Arc<ServiceRecord>> {
        if let Held::Service(record) = self { Some(Arc::clone(record)) } else { None }
    }

    /// An object of a kind kept whole, shared; `None` for a Pod's or a Service's record.
    pub(crate) fn into_other(self) -> Option<Arc<AnyObject>> {
        if let Held::Other(object) = self { Some(object) } else { None }
    }

    pub(crate) fn as_pod(&self) -> Option<&HeldPod> {
        if let Held::Pod(record) = self { Some(record) } else { None }
    }
}

/// A 128-bit digest of a document's text (two keyed SipHash runs): telling "same text" from
/// "different text" without keeping the text.
type DocHash = (u64, u64);

fn digest(text: &str) -> DocHash {
    let mut first = DefaultHasher::new();
    0u8.hash(&mut first);
    text.hash(&mut first);
    let mut second = DefaultHasher::new();
    1u8.hash(&mut second);
    text.hash(&mut second);
    (first.finish(), second.finish())
}

/// One object whose winning definition changed: its name, its winning definition before
/// (`None` when no file defined it) and now (`None` when no file defines it any more).
pub(crate) type ObjectChange = (ObjectRef, Option<Held>, Option<Held>);

/// An object's name, shared by the controller step's maps and indexes of Services and the
/// other kinds it keeps. The store keeps each name once, inline ([`NamedTable`]), and
/// Pods are known elsewhere by the hash of their name ([`name_hash`]).
pub(crate) type Key = Arc<ObjectRef>;

/// Where a definition stands in a complete read: file, document, object (see
/// [`ManifestStore::order_of`]).
pub(crate) type DefinitionOrder<'a> = (&'a Path, usize, usize);

/// How much reading work the store did so far (for tests and benchmarks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreCounters {
    /// Files read from disk.
    pub files_read: u64,
    /// YAML documents (or whole JSON files) parsed.
    pub documents_parsed: u64,
}

/// Where the time of the last look at the directory went (for the log and benchmarks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Phases {
    /// Listing the directory and comparing fingerprints.
    pub list: Duration,
    /// Reading the changed files.
    pub read: Duration,
    /// Splitting them into documents and hashing each document's text.
    pub split: Duration,
    /// Parsing the new documents (YAML / JSON into records and objects).
    pub parse: Duration,
    /// Taking the files' old definitions out and putting the new ones in.
    pub store: Duration,
    /// The controller step (allocation, slices from Pods) and the conversion to the core's model.
    pub controller: Duration,
    /// Comparing the converted objects with what was sent before.
    pub diff: Duration,
}

/// Every file's documents and every object's definitions; see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct ManifestStore {
    files: BTreeMap<Arc<Path>, FileRecord>,
    definitions: NamedTable<OneOrMany<Definition>>,
    /// Objects with more than one definition.
    duplicated: BTreeSet<ObjectRef>,
    listing_errors: Vec<ManifestError>,
    /// What the held Pod records share.
    interner: Interner,
    pub(crate) counters: StoreCounters,
    pub(crate) phases: Phases,
}

/// A file's documents, as columns rather than one record per document: the digest and
/// the objects' names of each document, and the problems of the few that have some. A
/// record per document (digest, list of names, list of problems) was 64 bytes, 110k of
/// them at 10k Services x 10 Pods; the columns take 28 bytes a document.
#[derive(Debug, Default)]
struct FileRecord {
    /// Problems of the file as a whole (it could not be read).
    errors: Vec<ManifestError>,
    /// Each document's digest, by document; empty for a JSON file (parsed whole, never reused).
    hashes: Box<[DocHash]>,
    /// The objects the documents defined, as the hashes of their names ([`name_hash`]),
    /// document after document, each document's in order (`Definition::n` indexes a
    /// document's part): the store's table finds each by its hash and its definition here.
    objects: Box<[u64]>,
    /// Where each document's part of `objects` ends (index = document).
    ends: Box<[u32]>,
    /// The problems of the documents that have some: document, problems; in document order.
    document_errors: Box<[(u32, Box<[ManifestError]>)]>,
}

impl FileRecord {
    fn documents(&self) -> usize {
        self.ends.len()
    }

    /// The objects document `document` defined, in order.
    fn objects_of(&self, document: usize) -> &[u64] {
        let start = document.checked_sub(1).map_or(0, |previous| self.ends[previous] as usize);
        &self.objects[start..self.ends[document] as usize]
    }

    /// The digest of document `document` when it can be reused as it is: documents with
    /// problems are parsed again (their messages carry line numbers).
    fn reusable_hash(&self, document: usize) -> Option<DocHash> {
        let has_errors = self.document_errors.binary_search_by_key(&(document as u32), |(d, _)| *d).is_ok();
        self.hashes.get(document).copied().filter(|_| !has_errors)
    }
}

/// Builds a [`FileRecord`]'s document columns, document after document.
#[derive(Default)]
struct DocumentColumns {
    hashes: Vec<Option<DocHash>>,
    objects: Vec<u64>,
    ends: Vec<u32>,
    errors: Vec<(u32, Box<[ManifestError]>)>,
}

impl DocumentColumns {
    fn push(&mut self, hash: Option<DocHash>, objects: Vec<u64>, errors: Vec<ManifestError>) {
        let document = self.ends.len() as u32;
        self.hashes.push(hash);
        self.objects.extend(objects);
        self.ends.push(self.objects.len() as u32);
        if !errors.is_empty() {
            self.errors.push((document, errors.into()));
        }
    }

    fn finish(self, errors: Vec<ManifestError>) -> FileRecord {
        FileRecord {
            errors,
            // Every document of a YAML file has a digest, the one unit of a JSON file none.
            hashes: self.hashes.into_iter().collect::<Option<Box<[DocHash]>>>().unwrap_or_default(),
            objects: self.objects.into_boxed_slice(),
            ends: self.ends.into_boxed_slice(),
            document_errors: self.errors.into_boxed_slice(),
        }
    }
}

/// One value inline, or any other number boxed: almost every object has one definition
/// (a one-element list was an allocation of its own per object, 110k of them at 10k
/// Services x 10 Pods).
#[derive(Debug, Clone)]
enum OneOrMany<T> {
    One(T),
    Many(Box<[T]>),
}

impl<T> Default for OneOrMany<T> {
    fn default() -> Self {
        OneOrMany::Many(Box::default())
    }
}

impl<T> OneOrMany<T> {
    fn from_vec(mut values: Vec<T>) -> Self {
        match values.pop() {
            Some(only) if values.is_empty() => OneOrMany::One(only),
            Some(last) => {
                values.push(last);
                OneOrMany::Many(values.into_boxed_slice())
            }
            None => OneOrMany::default(),
        }
    }

    fn into_vec(self) -> Vec<T> {
        match self {
            OneOrMany::One(only) => vec![only],
            OneOrMany::Many(values) => values.into_vec(),
        }
    }

    fn as_slice(&self) -> &[T] {
        match self {
            OneOrMany::One(only) => std::slice::from_ref(only),
            OneOrMany::Many(values) => values,
        }
    }

    fn first(&self) -> Option<&T> {
        self.as_slice().first()
    }
}

/// A file's path behind a thin pointer: every definition names its file (110k at 10k
/// Services x 10 Pods), and an `Arc<Path>` is two words.
type FileName = Arc<PathBuf>;

#[derive(Debug, Clone)]
struct Definition {
    file: FileName,
    document: u32,
    n: u32,
    /// Where it is, as [`Position`] says it, without a second copy of the file name.
    at: Place,
    object: Held,
}

/// A [`Position`] without its file, in 12 bytes: one per definition (110k at 10k Services).
/// `0` / `u32::MAX` for what is not known (documents and lines count from 1).
#[derive(Debug, Clone, Copy)]
struct Place {
    document: u32,
    line: u32,
    item: u32,
}

fn small(value: Option<u64>) -> u32 {
    value.map_or(0, |value| u32::try_from(value).unwrap_or(u32::MAX))
}

impl Place {
    fn of(position: &Position) -> Self {
        Self {
            document: small(position.document.map(|d| d as u64)),
            line: small(position.line),
            item: position.item.map_or(u32::MAX, |item| u32::try_from(item).unwrap_or(u32::MAX - 1)),
        }
    }
}

impl Definition {
    /// Whether this is object `n` of document `document` of file `path`: one definition is.
    fn is_at(&self, path: &Path, document: usize, n: usize) -> bool {
        self.document as usize == document && self.n as usize == n && self.file.as_path() == path
    }

    fn order(&self) -> (&Path, usize, usize) {
        (self.file.as_path(), self.document as usize, self.n as usize)
    }

    fn position(&self) -> Position {
        let Place { document, line, item } = self.at;
        Position {
            file: Arc::from(self.file.as_path()),
            document: (document != 0).then_some(document as usize),
            line: (line != 0).then_some(u64::from(line)),
            item: (item != u32::MAX).then_some(item as usize),
        }
    }
}

/// About how much file text one batch of [`ManifestStore::apply`] reads and parses before
/// storing it (a file is never split): enough for the parse threads, small enough that
/// one batch's temporaries are a few megabytes.
const BATCH_TEXT: usize = 2 * 1024 * 1024;

/// How a document of a re-read file is obtained.
enum Source {
    /// The same text as document `old` of the previous version.
    Reused { old: usize, content_line: u64 },
    /// Parsed: index into the parse results.
    Parsed(usize),
}

impl ManifestStore {
    /// Applies a scan: `changed` files are read again, `removed` ones forgotten. Returns the
    /// objects whose winning definition changed, sorted (by kind, then name; the Pods of a
    /// first read in no particular order).
    pub(crate) fn apply(
        &mut self,
        changed: Vec<PathBuf>,
        removed: Vec<PathBuf>,
        listing_errors: Vec<ManifestError>,
    ) -> Vec<ObjectChange> {
        self.listing_errors = listing_errors;
        // From an empty store (a first read) every object held afterwards is a change from
        // nothing: no winner before needs remembering, object by object, and no document
        // can be reused.
        let from_empty = self.definitions.is_empty() && self.files.is_empty();
        let mut before: FastMap<ObjectRef, Option<Held>> = FastMap::default();
        for path in removed {
            if let Some(record) = self.files.remove(path.as_path()) {
                let path: Arc<Path> = Arc::from(path);
                self.take_definitions(&path, &record, &mut before);
            }
        }

        // The changed files a batch at a time (read, split, parse, store), so that the
        // parse's temporaries of one batch are freed before the next is parsed: the records
        // kept are made among at most one batch's remains, which the allocator then reuses,
        // rather than among the whole directory's (pages a record pins stay resident).
        self.phases.read = Duration::ZERO;
        self.phases.split = Duration::ZERO;
        self.phases.parse = Duration::ZERO;
        self.phases.store = Duration::ZERO;
        let paths: Vec<Arc<Path>> = changed.into_iter().map(Arc::from).collect();
        let (mut first, mut texts, mut batch_text) = (0, Vec::new(), 0);
        for (i, path) in paths.iter().enumerate() {
            let started = Instant::now();
            self.counters.files_read += 1;
            let text = fs::read_to_string(path)
                .map_err(|source| ManifestError::ReadFile { path: path.to_path_buf(), source: Arc::new(source) });
            batch_text += text.as_ref().map_or(0, String::len);
            texts.push(text);
            self.phases.read += started.elapsed();
            if batch_text >= BATCH_TEXT || i + 1 == paths.len() {
                let before = (!from_empty).then_some(&mut before);
                self.apply_batch(&paths[first..=i], std::mem::take(&mut texts), before);
                (first, batch_text) = (i + 1, 0);
            }
        }

        let started = Instant::now();
        if from_empty {
            let (mut changes, pods): (Vec<ObjectChange>, Vec<ObjectChange>) = self
                .definitions
                .iter()
                .filter_map(|(reference, definitions)| {
                    let new = definitions.first()?.object.clone();
                    Some((reference.clone(), None, Some(new)))
                })
                .partition(|(reference, _, _)| reference.kind != ObjectKind::Pod);
            // The Pods, most of a first read, stay in no particular order among the sorted
            // other kinds: the controller step files them into sets, and with every Service
            // new it looks up none of them (sorting 100k names took ~30 ms).
            changes.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            let at = changes.partition_point(|(reference, _, _)| reference.kind < ObjectKind::Pod);
            changes.splice(at..at, pods);
            self.interner.forget_unused();
            self.phases.store += started.elapsed();
            return changes;
        }
        let mut changes: Vec<ObjectChange> = before
            .into_iter()
            .filter_map(|(reference, old)| {
                let new = winner(&self.definitions, &reference);
                let same = match (&old, &new) {
                    (None, None) => true,
                    (Some(a), Some(b)) => a == b,
                    _ => false,
                };
                (!same).then_some((reference, old, new))
            })
            .collect();
        changes.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        self.interner.forget_unused();
        self.phases.store += started.elapsed();
        changes
    }

    /// Splits, parses and stores one batch of re-read files (`texts` in the order of `paths`).
    fn apply_batch(
        &mut self,
        paths: &[Arc<Path>],
        texts: Vec<Result<String, ManifestError>>,
        mut before: Option<&mut FastMap<ObjectRef, Option<Held>>>,
    ) {
        // Decide document by document what to parse.
        let started = Instant::now();
        let mut work: Vec<Work<'_>> = Vec::new();
        let mut plans: Vec<Vec<(Option<DocHash>, Source)>> = Vec::with_capacity(paths.len());
        for (file, (path, text)) in paths.iter().zip(&texts).enumerate() {
            let mut plan = Vec::new();
            if let Ok(text) = text {
                if is_json(path) {
                    plan.push((None, Source::Parsed(work.len())));
                    push_work(&mut work, file, true, text);
                } else {
                    let old = self.files.get(path);
                    // The reusable documents of the previous version by text, first ones first.
                    let mut previous: HashMap<DocHash, VecDeque<usize>> = HashMap::new();
                    if let Some(record) = old {
                        for (i, hash) in (0..record.documents()).filter_map(|i| Some((i, record.reusable_hash(i)?))) {
                            previous.entry(hash).or_default().push_back(i);
                        }
                    }
                    let start = work.len();
                    push_work(&mut work, file, false, text);
                    for (index, unit) in work.iter().enumerate().skip(start) {
                        let Unit::Yaml { document, .. } = &unit.unit else { continue };
                        let hash = digest(document.text);
                        let reused = previous.get_mut(&hash).and_then(VecDeque::pop_front);
                        let source = match reused {
                            Some(old) => Source::Reused { old, content_line: document.content_line },
                            None => Source::Parsed(index),
                        };
                        plan.push((Some(hash), source));
                    }
                }
            }
            plans.push(plan);
        }
        self.phases.split += started.elapsed();
        let started = Instant::now();
        // Only the documents not reused are parsed (on several threads when there is much).
        let needed: Vec<usize> = plans
            .iter()
            .flatten()
            .filter_map(|(_, source)| match source {
                Source::Parsed(index) => Some(*index),
                Source::Reused { .. } => None,
            })
            .collect();
        let selected: Vec<Work<'_>> =
            needed.iter().map(|&index| Work { file: work[index].file, unit: work[index].unit }).collect();
        self.counters.documents_parsed += selected.len() as u64;
        // By work unit (a map keyed by unit hashed and probed once per document, 110k times
        // in a first read).
        let mut results: Vec<Option<FileContents>> = std::iter::repeat_with(|| None).take(work.len()).collect();
        for (&index, (_, contents)) in needed.iter().zip(parse_work(&selected, paths)) {
            results[index] = Some(contents);
        }
        self.phases.parse += started.elapsed();
        let started = Instant::now();

        for ((path, text), plan) in paths.iter().zip(texts.iter()).zip(plans) {
            let old = self.files.remove(path).unwrap_or_default();
            let mut old_definitions = match before.as_deref_mut() {
                Some(before) => self.take_definitions(path, &old, before),
                None => Vec::new(),
            };
            let mut columns = DocumentColumns::default();
            let file_name: FileName = Arc::new(path.to_path_buf());
            let numbered = plan.len() > 1;
            for (index, (hash, source)) in plan.into_iter().enumerate() {
                let document_number = numbered.then_some(index + 1);
                let mut objects = Vec::new();
                let mut errors = Vec::new();
                match source {
                    Source::Reused { old: old_index, content_line } => {
                        for (reference, mut definition) in std::mem::take(&mut old_definitions[old_index]) {
                            definition.document = index as u32;
                            definition.at.document = small(document_number.map(|d| d as u64));
                            if definition.at.item == u32::MAX {
                                definition.at.line = small(Some(content_line));
                            }
                            objects.push(name_hash(&reference));
                            self.insert(reference, definition);
                        }
                    }
                    Source::Parsed(work_index) => {
                        let contents = results[work_index].take().unwrap_or_default();
                        errors = contents.errors;
                        for (n, ParsedObject { object, position }) in contents.objects.into_iter().enumerate() {
                            let reference = object.reference();
                            if let Some(before) = before.as_deref_mut()
                                && !before.contains_key(&reference)
                            {
                                before.insert(reference.clone(), winner(&self.definitions, &reference));
                            }
                            objects.push(name_hash(&reference));
                            let definition = Definition {
                                file: Arc::clone(&file_name),
                                document: index as u32,
                                n: n as u32,
                                at: Place::of(&position),
                                object: Held::new(object, &mut self.interner),
                            };
                            self.insert(reference, definition);
                        }
                    }
                }
                columns.push(hash, objects, errors);
            }
            let errors = text.as_ref().err().cloned().into_iter().collect();
            self.files.insert(Arc::clone(path), columns.finish(errors));
        }
        self.phases.store += started.elapsed();
    }

    /// Removes every definition `record` (of file `path`) made, remembering each object's
    /// winner before; returns the definitions by document, each with its object's name.
    fn take_definitions(
        &mut self,
        path: &Arc<Path>,
        record: &FileRecord,
        before: &mut FastMap<ObjectRef, Option<Held>>,
    ) -> Vec<Vec<(ObjectRef, Definition)>> {
        let mut taken = Vec::with_capacity(record.documents());
        for index in 0..record.documents() {
            let objects = record.objects_of(index);
            let mut definitions = Vec::with_capacity(objects.len());
            for (n, &hash) in objects.iter().enumerate() {
                let here = |d: &Definition| d.is_at(path, index, n);
                let Some(at) = self.definitions.find(hash, |_, list| list.as_slice().iter().any(here)) else {
                    continue;
                };
                let (reference, list) = self.definitions.at(at);
                let reference = reference.clone();
                if !before.contains_key(&reference) {
                    before.insert(reference.clone(), list.first().map(|first| first.object.clone()));
                }
                let mut list = std::mem::take(self.definitions.at_mut(at)).into_vec();
                if let Some(found) = list.iter().position(here) {
                    definitions.push((reference.clone(), list.remove(found)));
                }
                let left = list.len();
                *self.definitions.at_mut(at) = OneOrMany::from_vec(list);
                match left {
                    0 => {
                        self.definitions.remove_at(at);
                        self.duplicated.remove(&reference);
                    }
                    1 => {
                        self.duplicated.remove(&reference);
                    }
                    _ => {}
                }
            }
            taken.push(definitions);
        }
        taken
    }

    fn insert(&mut self, reference: ObjectRef, definition: Definition) {
        // Almost every object has one definition, held inline (see [`OneOrMany`]).
        let duplicated =
            self.definitions.insert_or_merge(reference.clone(), OneOrMany::One(definition), |held, new| {
                let mut list = std::mem::take(held).into_vec();
                for definition in new.into_vec() {
                    let at = list.partition_point(|d| d.order() < definition.order());
                    list.insert(at, definition);
                }
                *held = OneOrMany::from_vec(list);
            });
        if duplicated {
            self.duplicated.insert(reference);
        }
    }

    /// Every problem: listing, then file by file in path order (the file's own problems,
    /// then its duplicate definitions).
    pub(crate) fn errors(&self) -> Vec<ManifestError> {
        let mut duplicates: HashMap<&Path, Vec<(usize, usize, ManifestError)>> = HashMap::new();
        for reference in &self.duplicated {
            let Some(list) = self.definitions.get(reference) else { continue };
            let Some((first, later)) = list.as_slice().split_first() else { continue };
            for definition in later {
                let error = ManifestError::DuplicateObject {
                    position: definition.position(),
                    object: reference.clone(),
                    first: first.position(),
                };
                duplicates.entry(definition.file.as_path()).or_default().push((
                    definition.document as usize,
                    definition.n as usize,
                    error,
                ));
            }
        }
        let mut errors = self.listing_errors.clone();
        for (path, record) in &self.files {
            errors.extend(record.errors.iter().cloned());
            for (_, document_errors) in &record.document_errors {
                errors.extend(document_errors.iter().cloned());
            }
            if let Some(mut found) = duplicates.remove(&**path) {
                found.sort_unstable_by_key(|(document, n, _)| (*document, *n));
                errors.extend(found.into_iter().map(|(_, _, error)| error));
            }
        }
        errors
    }

    /// Where the winning definition of `object` stands in a complete read: file (in path
    /// order), document, object. A complete read hands the controller its objects in this
    /// order, and the allocator settles conflicting requests (two Services asking for the
    /// same ClusterIP) by it, so an incremental caller must too.
    pub(crate) fn order_of(&self, object: &ObjectRef) -> Option<DefinitionOrder<'_>> {
        self.definitions.get(object).and_then(OneOrMany::first).map(Definition::order)
    }

    /// The Pods whose names hash to `hash` ([`name_hash`]; usually one), with their winning
    /// records.
    pub(crate) fn pods_with_hash(&self, hash: u64) -> impl Iterator<Item = (&ObjectRef, &HeldPod)> {
        self.definitions
            .with_hash(hash)
            .filter(|(name, _)| name.kind == ObjectKind::Pod)
            .filter_map(|(name, list)| Some((name, list.first()?.object.as_pod()?)))
    }

    /// Where the winning definition of `object` is.
    pub(crate) fn position_of(&self, object: &ObjectRef) -> Option<Position> {
        self.definitions.get(object).and_then(OneOrMany::first).map(Definition::position)
    }

    /// The whole state as one complete load (objects in path, then document order), as
    /// [`crate::load_directory`] returns it.
    pub(crate) fn loaded(&self) -> Loaded {
        let mut assembler = Assembler::default();
        for (path, record) in &self.files {
            for index in 0..record.documents() {
                for (n, &hash) in record.objects_of(index).iter().enumerate() {
                    let winning_here = |_: &ObjectRef, list: &OneOrMany<Definition>| {
                        list.first().is_some_and(|first| first.is_at(path, index, n))
                    };
                    let Some(at) = self.definitions.find(hash, winning_here) else { continue };
                    let (reference, list) = self.definitions.at(at);
                    let Some(first) = list.first() else { continue };
                    assembler.add_object(ParsedObject {
                        object: first.object.to_object(reference),
                        position: first.position(),
                    });
                }
            }
        }
        let mut loaded = assembler.finish();
        loaded.errors = self.errors();
        loaded
    }
}

fn winner(definitions: &NamedTable<OneOrMany<Definition>>, reference: &ObjectRef) -> Option<Held> {
    definitions.get(reference).and_then(OneOrMany::first).map(|d| d.object.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifests::ObjectKind;

    fn key(name: &str) -> u64 {
        name_hash(&ObjectRef::new(ObjectKind::Pod, "shop", name))
    }

    #[test]
    fn a_file_record_s_columns_give_back_each_document_s_objects_and_reuse_only_documents_without_problems() {
        let file: Arc<Path> = Arc::from(Path::new("shop.yaml"));
        let problem = || ManifestError::MissingName { position: Position::file(&file), kind: ObjectKind::Pod };
        let (a, b, c) = (key("a"), key("b"), key("c"));
        let mut columns = DocumentColumns::default();
        columns.push(Some((1, 1)), vec![a], Vec::new());
        columns.push(Some((2, 2)), Vec::new(), vec![problem()]);
        columns.push(Some((3, 3)), vec![b, c], Vec::new());
        columns.push(Some((4, 4)), Vec::new(), Vec::new());
        let record = columns.finish(vec![problem()]);
        assert_eq!(record.documents(), 4);
        assert_eq!(record.objects_of(0), [a]);
        assert!(record.objects_of(1).is_empty());
        assert_eq!(record.objects_of(2), [b, c]);
        assert!(record.objects_of(3).is_empty());
        let reusable: Vec<Option<DocHash>> = (0..4).map(|d| record.reusable_hash(d)).collect();
        assert_eq!(
            reusable,
            [Some((1, 1)), None, Some((3, 3)), Some((4, 4))],
            "the document with a problem is parsed again"
        );
        assert_eq!(record.document_errors.len(), 1);
        assert_eq!(record.errors.len(), 1);

        let mut json = DocumentColumns::default();
        json.push(None, vec![key("d"), key("e")], Vec::new());
        let record = json.finish(Vec::new());
        assert_eq!((record.documents(), record.objects_of(0).len()), (1, 2));
        assert_eq!(record.reusable_hash(0), None, "a JSON file's one unit has no digest and is never reused");
    }

    #[test]
    fn a_held_object_is_no_wider_than_a_pod_s_record() {
        assert!(size_of::<Held>() <= 40, "{} bytes", size_of::<Held>());
    }

    #[test]
    fn an_object_s_one_definition_with_a_pod_s_record_inline_takes_72_bytes_in_the_table() {
        assert!(size_of::<OneOrMany<Definition>>() <= 72, "{} bytes", size_of::<OneOrMany<Definition>>());
    }
}
