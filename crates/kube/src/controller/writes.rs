//! From desired slices and existing ones to the fewest writes, the way the upstream
//! reconciler places endpoints.
//!
//! Desired endpoints come from `svcplane-controller`'s planner and are grouped by address
//! type and port list. Within a group every existing slice keeps the endpoints it already
//! holds that are still wanted (refreshed in place), in its own order; slices that changed
//! anyway take the new endpoints while they have room; the rest go into new slices of at
//! most `max` endpoints, except that a last, partial batch goes into an untouched slice with
//! room rather than into a new one. Slices left empty are deleted, slices of port lists no
//! longer wanted too. So one Pod changing touches one slice, whatever the Service's size.
//!
//! As upstream, every address type of a Service with a selector that ends up without any
//! slice gets a placeholder slice (no ports, no endpoints); an existing equal placeholder is
//! kept.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// One write to the API.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// A new slice; its metadata has `generateName`, no name.
    Create(EndpointSlice),
    /// An existing slice, with its name and resourceVersion, new contents.
    Update(EndpointSlice),
    /// An existing slice by name.
    Delete(String),
}

/// What a slice group is keyed by: address type and the port list (order-insensitive).
type GroupKey = (String, Vec<String>);

fn port_text(port: &EndpointPort) -> String {
    format!(
        "{}/{}/{}/{}",
        port.name.as_deref().unwrap_or_default(),
        port.protocol.as_deref().unwrap_or("TCP"),
        port.port.unwrap_or_default(),
        port.app_protocol.as_deref().unwrap_or_default()
    )
}

fn group_key(slice: &EndpointSlice) -> GroupKey {
    let mut ports: Vec<String> = slice.ports.iter().flatten().map(port_text).collect();
    ports.sort();
    (slice.address_type.clone(), ports)
}

fn endpoint_id(endpoint: &Endpoint) -> String {
    endpoint.addresses.first().cloned().unwrap_or_default()
}

/// Whether the Service gets slices (and so a placeholder when it has no endpoints).
pub fn has_selector(service: &Service) -> bool {
    service.spec.as_ref().is_some_and(|spec| {
        spec.type_.as_deref() != Some("ExternalName") && spec.selector.as_ref().is_some_and(|s| !s.is_empty())
    })
}

/// The placeholder slice of `template`'s Service for one address type: no ports, no endpoints.
fn placeholder(template: &ObjectMeta, address_type: &str) -> EndpointSlice {
    EndpointSlice {
        metadata: template.clone(),
        address_type: address_type.to_owned(),
        endpoints: Vec::new(),
        ports: Some(Vec::new()),
    }
}

fn is_placeholder(slice: &EndpointSlice, address_type: &str) -> bool {
    slice.endpoints.is_empty() && slice.ports.as_ref().is_none_or(Vec::is_empty) && slice.address_type == address_type
}

/// The metadata of a new slice: `template`'s, with `generateName: <service>-` instead of a name.
fn new_metadata(template: &ObjectMeta, service_name: &str) -> ObjectMeta {
    ObjectMeta { name: None, generate_name: Some(format!("{service_name}-")), ..template.clone() }
}

/// The writes that turn `existing` (the slices this controller owns for the Service) into
/// `desired` (the planner's slices for it, all with the same labels and owner). `template`
/// is the metadata every slice of the Service must carry (labels, owner reference,
/// namespace); `None` when the Service is gone or gets no slices. `placeholder_types` are
/// the address types (`IPv4`, `IPv6`) that get a placeholder when left without slices.
pub fn plan_writes(
    service_name: &str,
    template: Option<&ObjectMeta>,
    placeholder_types: &[String],
    desired: Vec<EndpointSlice>,
    existing: &[EndpointSlice],
    max: usize,
) -> Vec<Write> {
    let Some(template) = template else {
        return existing.iter().filter_map(|slice| slice.metadata.name.clone()).map(Write::Delete).collect();
    };
    let max = max.max(1);

    // Desired endpoints per group, in the planner's order; the group's port list.
    let mut wanted: BTreeMap<GroupKey, (Vec<EndpointPort>, Vec<Endpoint>)> = BTreeMap::new();
    for slice in desired {
        let key = group_key(&slice);
        let entry = wanted.entry(key).or_insert_with(|| (slice.ports.clone().unwrap_or_default(), Vec::new()));
        entry.1.extend(slice.endpoints);
    }
    let mut existing_by_group: BTreeMap<GroupKey, Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in existing {
        existing_by_group.entry(group_key(slice)).or_default().push(slice);
    }

    let mut writes = Vec::new();
    let mut deletes: Vec<&EndpointSlice> = Vec::new();
    // Slices kept or created, per address type.
    let mut kept: HashMap<String, usize> = HashMap::new();
    for (key, slices) in &existing_by_group {
        if !wanted.contains_key(key) {
            deletes.extend(slices.iter().copied());
        }
    }
    for (key, (ports, endpoints)) in wanted {
        let mut pending: HashMap<String, Endpoint> = HashMap::with_capacity(endpoints.len());
        let mut order: Vec<String> = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let id = endpoint_id(&endpoint);
            if pending.insert(id.clone(), endpoint).is_none() {
                order.push(id);
            }
        }
        // 1. Existing slices keep what is still wanted.
        let mut slices = existing_by_group.remove(&key).unwrap_or_default();
        slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let mut reworked: Vec<(&EndpointSlice, Vec<Endpoint>, bool)> = Vec::new();
        for slice in slices {
            let mut kept_endpoints = Vec::with_capacity(slice.endpoints.len());
            let mut changed = false;
            for endpoint in &slice.endpoints {
                match pending.remove(&endpoint_id(endpoint)) {
                    Some(fresh) => {
                        changed |= fresh != *endpoint;
                        kept_endpoints.push(fresh);
                    }
                    None => changed = true,
                }
            }
            changed |= !same_metadata(&slice.metadata, template) || slice.ports.as_ref() != Some(&ports);
            reworked.push((slice, kept_endpoints, changed));
        }
        let mut new_endpoints: Vec<Endpoint> = order.into_iter().filter_map(|id| pending.remove(&id)).collect();
        new_endpoints.reverse(); // popped from the end, in order

        // 2. Slices that change anyway take new endpoints while they have room.
        for (_, endpoints, changed) in &mut reworked {
            while *changed && endpoints.len() < max {
                let Some(endpoint) = new_endpoints.pop() else { break };
                endpoints.push(endpoint);
            }
        }
        // 3. Full new slices; a last partial batch prefers an untouched slice with room.
        while !new_endpoints.is_empty() {
            let take = new_endpoints.len().min(max);
            if take < max
                && let Some((_, endpoints, changed)) = reworked
                    .iter_mut()
                    .filter(|(_, e, changed)| !*changed && e.len() + take <= max)
                    .max_by_key(|(_, e, _)| e.len())
            {
                while let Some(endpoint) = new_endpoints.pop() {
                    endpoints.push(endpoint);
                }
                *changed = true;
                break;
            }
            let chunk: Vec<Endpoint> = (0..take).filter_map(|_| new_endpoints.pop()).collect();
            writes.push(Write::Create(EndpointSlice {
                metadata: new_metadata(template, service_name),
                address_type: key.0.clone(),
                endpoints: chunk,
                ports: Some(ports.clone()),
            }));
            *kept.entry(key.0.clone()).or_default() += 1;
        }
        for (slice, endpoints, changed) in reworked {
            if endpoints.is_empty() {
                deletes.push(slice);
            } else {
                *kept.entry(key.0.clone()).or_default() += 1;
                if changed {
                    writes.push(Write::Update(EndpointSlice {
                        metadata: ObjectMeta {
                            labels: template.labels.clone(),
                            owner_references: template.owner_references.clone(),
                            ..slice.metadata.clone()
                        },
                        address_type: slice.address_type.clone(),
                        endpoints,
                        ports: Some(ports.clone()),
                    }));
                }
            }
        }
    }

    for address_type in placeholder_types {
        if kept.get(address_type).is_some_and(|n| *n > 0) {
            continue;
        }
        let reusable = deletes
            .iter()
            .position(|slice| is_placeholder(slice, address_type) && same_metadata(&slice.metadata, template));
        match reusable {
            Some(index) => {
                deletes.remove(index);
            }
            None => {
                let mut created = placeholder(template, address_type);
                created.metadata = new_metadata(template, service_name);
                writes.push(Write::Create(created));
            }
        }
    }
    writes.extend(deletes.into_iter().filter_map(|slice| slice.metadata.name.clone()).map(Write::Delete));
    writes
}

fn same_metadata(existing: &ObjectMeta, template: &ObjectMeta) -> bool {
    existing.labels == template.labels && existing.owner_references == template.owner_references
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::EndpointConditions;
    use std::collections::BTreeMap as Map;

    fn v4() -> Vec<String> {
        vec!["IPv4".to_owned()]
    }

    fn template() -> ObjectMeta {
        ObjectMeta {
            namespace: Some("default".into()),
            labels: Some(Map::from([("kubernetes.io/service-name".to_owned(), "web".to_owned())])),
            ..ObjectMeta::default()
        }
    }

    fn endpoint(n: u32, ready: bool) -> Endpoint {
        Endpoint {
            addresses: vec![format!("198.18.{}.{}", 129 + n / 250, n % 250 + 1)],
            conditions: Some(EndpointConditions { ready: Some(ready), serving: Some(ready), terminating: Some(false) }),
            ..Endpoint::default()
        }
    }

    fn ports() -> Vec<EndpointPort> {
        vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            app_protocol: None,
        }]
    }

    fn slice(name: Option<&str>, endpoints: Vec<Endpoint>) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                name: name.map(str::to_owned),
                resource_version: name.map(|_| "1".to_owned()),
                ..template()
            },
            address_type: "IPv4".into(),
            endpoints,
            ports: Some(ports()),
        }
    }

    /// The planner's view: chunks of 100 of endpoints 0..n (one changed to not ready).
    fn desired(n: u32, not_ready: Option<u32>) -> Vec<EndpointSlice> {
        let all: Vec<Endpoint> = (0..n).map(|i| endpoint(i, Some(i) != not_ready)).collect();
        all.chunks(100).map(|chunk| slice(None, chunk.to_vec())).collect()
    }

    fn apply(existing: &mut Vec<EndpointSlice>, writes: &[Write]) {
        let mut counter = existing.len();
        for write in writes {
            match write {
                Write::Create(slice) => {
                    counter += 1;
                    let mut created = slice.clone();
                    created.metadata.name = Some(format!("web-{counter}"));
                    existing.push(created);
                }
                Write::Update(slice) => {
                    let index = existing.iter().position(|s| s.metadata.name == slice.metadata.name).unwrap();
                    existing[index] = slice.clone();
                }
                Write::Delete(name) => existing.retain(|s| s.metadata.name.as_ref() != Some(name)),
            }
        }
    }

    fn counts(writes: &[Write]) -> (usize, usize, usize) {
        writes.iter().fold((0, 0, 0), |(c, u, d), write| match write {
            Write::Create(_) => (c + 1, u, d),
            Write::Update(_) => (c, u + 1, d),
            Write::Delete(_) => (c, u, d + 1),
        })
    }

    #[test]
    fn a_new_service_with_250_endpoints_gets_three_slices_of_at_most_100() {
        let writes = plan_writes("web", Some(&template()), &v4(), desired(250, None), &[], 100);
        assert_eq!(counts(&writes), (3, 0, 0));
        let sizes: Vec<usize> =
            writes.iter().map(|w| if let Write::Create(s) = w { s.endpoints.len() } else { 0 }).collect();
        assert_eq!(sizes, [100, 100, 50]);
        let Write::Create(first) = &writes[0] else { unreachable!() };
        assert_eq!(first.metadata.generate_name.as_deref(), Some("web-"));
    }

    #[test]
    fn one_pod_changing_in_a_large_service_updates_exactly_one_slice() {
        let mut existing = Vec::new();
        apply(&mut existing, &plan_writes("web", Some(&template()), &v4(), desired(1000, None), &[], 100));
        assert_eq!(existing.len(), 10);
        let writes = plan_writes("web", Some(&template()), &v4(), desired(1000, Some(517)), &existing, 100);
        assert_eq!(counts(&writes), (0, 1, 0), "{writes:?}");
        apply(&mut existing, &writes);
        assert_eq!(plan_writes("web", Some(&template()), &v4(), desired(1000, Some(517)), &existing, 100), []);
    }

    #[test]
    fn a_pod_added_to_a_large_service_goes_into_a_slice_with_room_and_a_removed_one_updates_its_slice() {
        let mut existing = Vec::new();
        apply(&mut existing, &plan_writes("web", Some(&template()), &v4(), desired(150, None), &[], 100));
        let writes = plan_writes("web", Some(&template()), &v4(), desired(151, None), &existing, 100);
        assert_eq!(counts(&writes), (0, 1, 0), "the new endpoint fits the slice of 50: {writes:?}");
        apply(&mut existing, &writes);
        let fewer: Vec<EndpointSlice> = {
            let mut all: Vec<Endpoint> = (0..151).map(|i| endpoint(i, true)).collect();
            all.remove(3);
            vec![slice(None, all)]
        };
        let writes = plan_writes("web", Some(&template()), &v4(), fewer, &existing, 100);
        assert_eq!(counts(&writes), (0, 1, 0), "{writes:?}");
    }

    #[test]
    fn a_service_without_endpoints_gets_one_placeholder_and_keeps_it() {
        let writes = plan_writes("web", Some(&template()), &v4(), Vec::new(), &[], 100);
        let [Write::Create(created)] = writes.as_slice() else { panic!("{writes:?}") };
        assert!(created.endpoints.is_empty());
        assert_eq!(created.ports, Some(Vec::new()));
        let mut existing = Vec::new();
        apply(&mut existing, &writes);
        assert_eq!(plan_writes("web", Some(&template()), &v4(), Vec::new(), &existing, 100), []);
        // Endpoints arrive: the placeholder goes, a real slice comes.
        let writes = plan_writes("web", Some(&template()), &v4(), desired(2, None), &existing, 100);
        assert_eq!(counts(&writes), (1, 0, 1), "{writes:?}");
        apply(&mut existing, &writes);
        // And they leave again.
        let writes = plan_writes("web", Some(&template()), &v4(), Vec::new(), &existing, 100);
        assert_eq!(counts(&writes), (1, 0, 1), "{writes:?}");
    }

    #[test]
    fn the_slices_of_a_deleted_service_are_deleted() {
        let existing = vec![slice(Some("web-a"), vec![endpoint(1, true)]), slice(Some("web-b"), Vec::new())];
        let writes = plan_writes("web", None, &[], Vec::new(), &existing, 100);
        assert_eq!(writes, [Write::Delete("web-a".into()), Write::Delete("web-b".into())]);
    }

    #[test]
    fn changed_service_labels_update_every_slice() {
        let mut existing = Vec::new();
        apply(&mut existing, &plan_writes("web", Some(&template()), &v4(), desired(120, None), &[], 100));
        let mut relabelled = template();
        relabelled.labels.as_mut().unwrap().insert("team".into(), "a".into());
        let mut wanted = desired(120, None);
        for slice in &mut wanted {
            slice.metadata = relabelled.clone();
        }
        let writes = plan_writes("web", Some(&relabelled), &v4(), wanted, &existing, 100);
        assert_eq!(counts(&writes), (0, 2, 0));
    }
}
