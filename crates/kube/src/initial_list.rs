//! A watcher whose first list is a *streaming list* (one watch request that sends every
//! object as an event, then a bookmark marking the end of the initial state), falling back
//! to kube-runtime's list-then-watch where the API server does not stream lists.
//!
//! Why: at 10k Services the paged list (500 objects a page) is most of an API-fed proxy's
//! cold start, and the API server serves a streaming list from its watch cache in one
//! response (docs/benchmarks.md, "Streaming lists").
//!
//! Only the first list streams. A streaming list reads the watch cache at any version it
//! holds (`resourceVersion=0`), which for a client that has seen nothing is what a paged
//! list gives too; a later relist (after the watch expired) must not go back behind what
//! was already passed on, so relists are kube-runtime's paged, most-recent lists, as
//! before. An API server that rejects the streaming request (the `WatchList` feature gate
//! is off by default in Kubernetes 1.27-1.31 and 1.33) answers 4xx before the initial
//! state is complete: that kind is then listed page by page from then on.

use std::fmt::Debug;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tracing::info;

/// Which lister a [`watcher_streaming_first`] stream is on.
enum Lister<K> {
    /// The streaming first list: `started` once its `Init` passed, `complete` once its
    /// `InitDone` did.
    Streaming { stream: BoxStream<'static, watcher::Result<Event<K>>>, started: bool, complete: bool },
    /// kube-runtime's list-then-watch, for relists and servers that do not stream lists.
    Paged(BoxStream<'static, watcher::Result<Event<K>>>),
}

/// Watches `api` like `kube::runtime::watcher(api, config)`, the first list streamed where
/// the API server can (see the module's comment). `kind` names the objects in the log.
pub(crate) fn watcher_streaming_first<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: &'static str,
) -> BoxStream<'static, watcher::Result<Event<K>>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let streaming = watcher::watcher(api.clone(), config.clone().streaming_lists()).boxed();
    let first = Lister::Streaming { stream: streaming, started: false, complete: false };
    futures::stream::unfold((first, api, config), move |(mut lister, api, config)| async move {
        loop {
            let item = match &mut lister {
                Lister::Paged(stream) => stream.next().await?,
                Lister::Streaming { stream, started, complete } => {
                    let item = stream.next().await?;
                    let switch = match &item {
                        // A second `Init` is a relist: from now on page by page, most recent.
                        Ok(Event::Init) if *started => Some("relisting page by page".to_owned()),
                        Err(error) if !*complete && rejected_by_server(error) => {
                            Some(format!("the API server does not stream lists ({error}); listing page by page"))
                        }
                        Ok(Event::Init) => {
                            *started = true;
                            None
                        }
                        Ok(Event::InitDone) => {
                            *complete = true;
                            None
                        }
                        _ => None,
                    };
                    if let Some(why) = switch {
                        info!(kind, "{why}");
                        lister = Lister::Paged(watcher::watcher(api.clone(), config.clone()).boxed());
                        continue;
                    }
                    item
                }
            };
            return Some((item, (lister, api, config)));
        }
    })
    .boxed()
}

/// Whether the API server answered the request itself with a client error (4xx), other
/// than "gone" (410, an expired version, which a relist handles): it will answer a
/// streaming list the same way again.
fn rejected_by_server(error: &watcher::Error) -> bool {
    let code = match error {
        watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code,
        watcher::Error::WatchError(status) => status.code,
        _ => return false,
    };
    (400..500).contains(&code) && code != 410
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn status(code: u16) -> Box<Status> {
        Box::new(Status { code, ..Status::default() })
    }

    #[test]
    fn a_client_error_answered_by_the_api_server_means_it_does_not_stream_lists() {
        assert!(rejected_by_server(&watcher::Error::WatchStartFailed(kube::Error::Api(status(400)))));
        assert!(rejected_by_server(&watcher::Error::WatchStartFailed(kube::Error::Api(status(422)))));
        assert!(rejected_by_server(&watcher::Error::WatchError(status(403))));
    }

    #[test]
    fn an_expired_version_a_server_error_or_a_lost_connection_do_not_turn_streaming_off() {
        assert!(!rejected_by_server(&watcher::Error::WatchError(status(410))));
        assert!(!rejected_by_server(&watcher::Error::WatchStartFailed(kube::Error::Api(status(500)))));
        assert!(!rejected_by_server(&watcher::Error::NoResourceVersion));
    }
}
