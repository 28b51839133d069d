//! Keeps one shared set equal to the cloud's: one streamed list as the node (a list in
//! pages from a cloud without them), going on as the set's watch with bookmarks, resumed
//! where it ended; listed again only when the cloud can no longer resume it (410 Gone).
//! All in protobuf, the encoding the node's clients read.
use std::{sync::Arc, time::Duration};

use http_body_util::BodyExt;
use tokio::sync::watch;

use super::set::{Set, State};
use crate::{
    cache::objects::{self, Encoding, EventType},
    coordinator::cloud_get::{GetError, MAX_ANSWER, WATCH_SECONDS, get_as_node_in, list_as_node},
    kproto,
    upstream::cloud::Cloud,
};

const USER_AGENT: &str = "hub/node-watch-cache";
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
/// How long to wait before trying again after a failure.
const RETRY: Duration = Duration::from_secs(1);
/// How long to wait before asking again after the cloud refused the node this list.
const REFUSED_RETRY: Duration = Duration::from_secs(300);
/// How long a progress probe's watch asks to stay open (its bookmark comes as it ends).
const PROBE_SECONDS: u64 = 3;
/// The longest a progress probe may take.
const PROBE_LIMIT: Duration = Duration::from_secs(PROBE_SECONDS + 3);
/// How often a sync waiting for the cloud looks again.
const CLOUD_CHECK: Duration = Duration::from_millis(200);

/// Why a sync step stopped.
enum Stop {
    /// The cloud refused the node (401/403): the set is not shared for now.
    Refused(String),
    /// Anything else: try again shortly.
    Failed(String),
    /// The cloud can no longer resume the watch: list again.
    Relist,
    /// The cloud does not answer streamed lists: list in pages.
    Unsupported,
}

impl From<GetError> for Stop {
    fn from(e: GetError) -> Stop {
        match e.status.map(|s| s.as_u16()) {
            Some(401 | 403) => Stop::Refused(e.message),
            Some(410) => Stop::Relist,
            // kube-apiserver refuses the streamed list's options it does not know.
            Some(400 | 422) => Stop::Unsupported,
            _ => Stop::Failed(e.message),
        }
    }
}

/// Keeps `set` current until `stop`.
pub async fn run(set: Arc<Set>, cloud: Arc<Cloud>, path: String, mut stop: watch::Receiver<bool>) {
    let sleep = |d: Duration, stop: &mut watch::Receiver<bool>| {
        let mut stop = stop.clone();
        async move {
            tokio::select! {
                _ = tokio::time::sleep(d) => false,
                _ = stop.wait_for(|s| *s) => true,
            }
        }
    };
    let (mut listed, mut streamed) = (false, true);
    loop {
        while !cloud.healthy() {
            if sleep(CLOUD_CHECK, &mut stop).await {
                return;
            }
        }
        let step = async {
            if !listed && streamed {
                let (done, ended) = streamed_list(&set, &cloud, &path).await;
                listed = done;
                match ended {
                    Ok(()) => {}
                    Err(Stop::Unsupported) => {
                        streamed = false;
                        return Stop::Relist;
                    }
                    Err(stop) => return stop,
                }
            }
            if !listed {
                if let Err(stop) = list(&set, &cloud, &path).await {
                    return stop;
                }
                listed = true;
            }
            watch_from(&set, &cloud, &path).await
        };
        let stopped = tokio::select! {
            s = step => s,
            _ = stop.wait_for(|s| *s) => return,
        };
        let wait = match stopped {
            Stop::Relist | Stop::Unsupported => {
                listed = false;
                continue;
            }
            Stop::Refused(why) => {
                tracing::warn!(
                    gvr = set.gvr,
                    "node-level watch cache: the cloud refuses the node this resource ({why}); its clients are answered by the cloud"
                );
                listed = false;
                set.set_state(State::Broken(format!("the cloud refuses the node: {why}")));
                REFUSED_RETRY
            }
            Stop::Failed(why) => {
                tracing::debug!(gvr = set.gvr, "node-level watch cache: {why}");
                set.set_state(if listed {
                    State::Resuming(why)
                } else {
                    State::Broken(why)
                });
                RETRY
            }
        };
        if sleep(wait, &mut stop).await {
            return;
        }
    }
}

/// A streamed list, as client-go 1.35+ lists (`sendInitialEvents=true`): the set's objects
/// as ADDED events up to the bookmark annotated `k8s.io/initial-events-end`, which makes
/// the set exactly them; the same answer then goes on as the set's watch until it ends.
/// One request instead of a list in pages and a watch. Whether the set was listed, and
/// how the answer ended.
async fn streamed_list(set: &Set, cloud: &Cloud, path: &str) -> (bool, Result<(), Stop>) {
    let q = format!(
        "{path}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds={WATCH_SECONDS}"
    );
    let resp = match get_as_node_in(cloud, &q, USER_AGENT, PROTOBUF).await {
        Ok(r) => r,
        Err(e) => return (false, Err(e.into())),
    };
    let mut initial = Initial::default();
    let ended = follow(set, resp, Until::End, Some(&mut initial)).await;
    if initial.done {
        return (true, ended);
    }
    let ended = ended.and(Err(Stop::Failed(
        "the streamed list ended before its end bookmark".into(),
    )));
    (false, ended)
}

/// A streamed list's objects until its end bookmark.
#[derive(Default)]
struct Initial {
    items: Vec<crate::cache::objects::Item>,
    done: bool,
}

/// Lists the resource (all pages) and makes the set exactly that.
async fn list(set: &Set, cloud: &Cloud, path: &str) -> Result<(), Stop> {
    let listed = list_as_node(cloud, path, &set.resource, USER_AGENT, PROTOBUF).await?;
    if listed.bad > 0 {
        return Err(Stop::Failed(format!(
            "the cloud's list held {} objects the hub cannot read",
            listed.bad
        )));
    }
    tracing::info!(
        gvr = set.gvr,
        rv = listed.rv,
        objects = listed.items.len(),
        "node-level watch cache: listed from the cloud"
    );
    set.replace(listed.items, listed.rv);
    Ok(())
}

/// Applies the cloud's watch from the set's resourceVersion until it ends or fails.
async fn watch_from(set: &Set, cloud: &Cloud, path: &str) -> Stop {
    loop {
        let q = format!(
            "{path}?watch=1&resourceVersion={}&allowWatchBookmarks=true&timeoutSeconds={WATCH_SECONDS}",
            set.rv()
        );
        let resp = match get_as_node_in(cloud, &q, USER_AGENT, PROTOBUF).await {
            Ok(r) => r,
            Err(e) => return e.into(),
        };
        set.set_state(State::Current);
        if let Err(stop) = follow(set, resp, Until::End, None).await {
            return stop;
        }
        // The cloud ended the watch (its timeout): watch again from where the set is.
    }
}

/// Answers the set's readers' wish to see the cloud's progress (`Set::reaches`), one
/// probe at a time, until `stop`.
pub async fn probe_when_wanted(
    set: Arc<Set>,
    cloud: Arc<Cloud>,
    path: String,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = set.wanted.notified() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if set.state() != State::Current {
            continue;
        }
        match tokio::time::timeout(PROBE_LIMIT, probe(&set, &cloud, &path)).await {
            Ok(Ok(())) => {}
            Ok(Err(Stop::Refused(why) | Stop::Failed(why))) => {
                tracing::debug!(
                    gvr = set.gvr,
                    "node-level watch cache: progress probe: {why}"
                )
            }
            Ok(Err(Stop::Relist | Stop::Unsupported)) | Err(_) => {}
        }
    }
}

/// A short watch from where the set stands. kube-apiserver's watch cache sends such a watch
/// a bookmark as its timeout ends, at the cache's resourceVersion, after every earlier event
/// of that stream (seen on 1.36: a watch of 3 s or more gets one then; of 1 or 2 s, none);
/// and the reader's consistent check has already brought that cache up to the cloud's
/// resourceVersion. So the probe shows within about 3 s that the set has passed it, or
/// brings the events it lacked first.
async fn probe(set: &Set, cloud: &Cloud, path: &str) -> Result<(), Stop> {
    let q = format!(
        "{path}?watch=1&resourceVersion={}&allowWatchBookmarks=true&timeoutSeconds={PROBE_SECONDS}",
        set.rv()
    );
    let resp = get_as_node_in(cloud, &q, USER_AGENT, PROTOBUF).await?;
    follow(set, resp, Until::Bookmark, None).await
}

/// How long to read a watch.
#[derive(PartialEq, Eq)]
enum Until {
    End,
    /// The first bookmark (then the stream is dropped).
    Bookmark,
}

/// Applies a watch answer's events to the set.
async fn follow(
    set: &Set,
    resp: hyper::Response<crate::body::ProxyBody>,
    until: Until,
    mut initial: Option<&mut Initial>,
) -> Result<(), Stop> {
    let json = resp
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"));
    let enc = if json {
        Encoding::Json
    } else {
        Encoding::Protobuf
    };
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let data = match frame {
            Ok(f) => match f.into_data() {
                Ok(d) => d,
                Err(_) => continue,
            },
            Err(e) => return Err(Stop::Failed(format!("the cloud's watch: {e}"))),
        };
        buf.extend_from_slice(&data);
        if buf.len() > MAX_ANSWER {
            return Err(Stop::Failed("a watch event over the size limit".into()));
        }
        let (events, used) = if json {
            json_lines(&buf)
        } else {
            kproto::watch_frames(&buf)
        };
        for event in events {
            match apply(set, enc, event, &mut initial) {
                Applied::Event => {}
                Applied::Bookmark if until == Until::Bookmark => return Ok(()),
                Applied::Bookmark => {}
                Applied::Stop(stop) => return Err(stop),
            }
        }
        buf.drain(..used);
    }
    Ok(())
}

/// Complete JSON lines at the front of `buf`, and how many bytes they use.
fn json_lines(buf: &[u8]) -> (Vec<&[u8]>, usize) {
    let (mut lines, mut used) = (Vec::new(), 0);
    while let Some(nl) = buf[used..].iter().position(|b| *b == b'\n') {
        lines.push(&buf[used..used + nl]);
        used += nl + 1;
    }
    (lines, used)
}

enum Applied {
    Event,
    Bookmark,
    /// The watch must stop.
    Stop(Stop),
}

/// Applies one event; while a streamed list's initial events come (`initial`), collects
/// them instead, and its end bookmark makes the set exactly them.
fn apply(set: &Set, enc: Encoding, event: &[u8], initial: &mut Option<&mut Initial>) -> Applied {
    let listing = initial.as_deref_mut().filter(|i| !i.done);
    if let Some(mark) = objects::bookmark(enc, event) {
        match listing {
            // Any other bookmark first: not a streamed list (a server that ignored the
            // option answers a plain watch).
            Some(_) if !mark.initial_events_end => return Applied::Stop(Stop::Unsupported),
            Some(init) => {
                let items = std::mem::take(&mut init.items);
                tracing::info!(
                    gvr = set.gvr,
                    rv = mark.rv,
                    objects = items.len(),
                    "node-level watch cache: listed from the cloud (streamed)"
                );
                set.replace(items, mark.rv);
                init.done = true;
            }
            None => set.advance(mark.rv),
        }
        return Applied::Bookmark;
    }
    match objects::parse_event(&set.resource, enc, event) {
        Ok((EventType::Added, Some(item))) if listing.is_some() => {
            if let Some(init) = listing {
                init.items.push(item);
            }
            Applied::Event
        }
        Ok((EventType::Modified | EventType::Deleted, Some(_))) if listing.is_some() => {
            Applied::Stop(Stop::Unsupported)
        }
        Ok((ty @ (EventType::Added | EventType::Modified | EventType::Deleted), Some(item))) => {
            set.apply(ty, item);
            Applied::Event
        }
        // ERROR: 410 Gone (the cloud compacted past the set) or another failure: list
        // again rather than hold a set that may have missed a change.
        Ok(_) => Applied::Stop(Stop::Relist),
        Err(e) => Applied::Stop(Stop::Failed(format!("the cloud's watch event: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn added(name: &str, rv: u64) -> Vec<u8> {
        format!(r#"{{"type":"ADDED","object":{{"kind":"Service","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"ns1","resourceVersion":"{rv}"}}}}}}"#).into_bytes()
    }

    fn bookmark(rv: u64, end: bool) -> Vec<u8> {
        let annotations = if end {
            r#","annotations":{"k8s.io/initial-events-end":"true"}"#
        } else {
            ""
        };
        format!(r#"{{"type":"BOOKMARK","object":{{"kind":"Service","apiVersion":"v1","metadata":{{"resourceVersion":"{rv}"{annotations}}}}}}}"#).into_bytes()
    }

    #[test]
    fn a_streamed_list_replaces_the_set_at_its_end_and_goes_on_as_its_watch() {
        let set = Set::new("/v1/services", "services");
        let mut initial = Initial::default();
        let mut listing = Some(&mut initial);
        for e in [added("a", 5), added("b", 6)] {
            assert!(matches!(
                apply(&set, Encoding::Json, &e, &mut listing),
                Applied::Event
            ));
        }
        // Nothing is in the set before the end bookmark.
        assert_eq!(set.summary().objects, 0);
        let end = bookmark(9, true);
        assert!(matches!(
            apply(&set, Encoding::Json, &end, &mut listing),
            Applied::Bookmark
        ));
        assert_eq!((set.summary().objects, set.rv()), (2, 9));
        // Later events are the set's watch.
        let c = added("c", 10);
        assert!(matches!(
            apply(&set, Encoding::Json, &c, &mut listing),
            Applied::Event
        ));
        assert_eq!((set.summary().objects, set.rv()), (3, 10));
    }

    #[test]
    fn a_plain_watch_answered_for_a_streamed_list_is_not_taken_for_one() {
        let set = Set::new("/v1/services", "services");
        let mut initial = Initial::default();
        let mut listing = Some(&mut initial);
        apply(&set, Encoding::Json, &added("a", 5), &mut listing);
        let plain = bookmark(9, false);
        let applied = apply(&set, Encoding::Json, &plain, &mut listing);
        assert!(matches!(applied, Applied::Stop(Stop::Unsupported)));
        assert_eq!(set.summary().objects, 0);
    }

    /// The events of a recorded watch answer, each as its frame (a JSON line, or a protobuf
    /// frame without its length).
    fn recorded_events(name: &str) -> (Encoding, Vec<Vec<u8>>) {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/wire/kube-apiserver-1.36"
        );
        let body = std::fs::read(format!("{dir}/{name}/response.body")).unwrap();
        if name.ends_with("protobuf") {
            let (frames, used) = kproto::watch_frames(&body);
            assert_eq!(used, body.len(), "{name}: whole frames");
            (
                Encoding::Protobuf,
                frames.into_iter().map(<[u8]>::to_vec).collect(),
            )
        } else {
            let (lines, _) = json_lines(&body);
            (
                Encoding::Json,
                lines.into_iter().map(<[u8]>::to_vec).collect(),
            )
        }
    }

    /// What a watch answer from the set sends, event by event, until `enough` says so.
    async fn served(
        resp: hyper::Response<crate::body::ProxyBody>,
        enc: Encoding,
        enough: impl Fn(&[Vec<u8>]) -> bool,
    ) -> Vec<Vec<u8>> {
        let mut body = resp.into_body();
        let (mut buf, mut events) = (Vec::new(), Vec::new());
        while !enough(&events) {
            let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
                .await
                .expect("an event in time")
                .expect("the watch goes on")
                .unwrap();
            buf.extend_from_slice(&frame.into_data().unwrap());
            let (got, used) = match enc {
                Encoding::Json => json_lines(&buf),
                Encoding::Protobuf => kproto::watch_frames(&buf),
            };
            events.extend(got.into_iter().map(<[u8]>::to_vec));
            buf.drain(..used);
        }
        events
    }

    /// kubelet 1.36's recorded streamed list of its pods (1035 ADDED, the end bookmark, then
    /// changes), in both encodings, taken as the set's streamed list: a streamed list served
    /// from the set to the same request carries the recorded ADDED events byte for byte and
    /// ends at the recorded bookmark's resourceVersion; a watch resumed from that bookmark
    /// carries the recorded changes after it, byte for byte.
    #[tokio::test]
    async fn a_recorded_streamed_list_is_served_back_from_the_set_as_recorded() {
        use crate::{proxy::request::RequestInfo, shared::watch};
        let query = "allowWatchBookmarks=true&fieldSelector=spec.nodeName%3Dedge-node-1&resourceVersionMatch=NotOlderThan&sendInitialEvents=true&timeoutSeconds=3&watch=true";
        let info = RequestInfo::parse(&hyper::Method::GET, "/api/v1/pods", query);
        for name in [
            "watchlist-pods-nodename-protobuf",
            "watchlist-pods-nodename-json",
        ] {
            let (enc, events) = recorded_events(name);
            let accept = enc.content_type();
            let set = Arc::new(Set::new("/v1/pods", "pods"));
            let mut initial = Initial::default();
            let mut listing = Some(&mut initial);
            let mut end = None;
            for (i, e) in events.iter().enumerate() {
                apply(&set, enc, e, &mut listing);
                if listing.as_ref().is_some_and(|l| l.done) {
                    end = Some(i);
                    break;
                }
            }
            let end = end.unwrap_or_else(|| panic!("{name}: no end bookmark"));
            let end_rv = objects::bookmark(enc, &events[end]).unwrap().rv;
            let added = |evs: &[Vec<u8>]| -> Vec<Vec<u8>> {
                let mut a: Vec<Vec<u8>> = evs
                    .iter()
                    .filter(|e| objects::event_type(enc, e) == EventType::Added)
                    .cloned()
                    .collect();
                a.sort();
                a
            };
            let keep_open: Arc<dyn Fn() -> bool + Send + Sync> = Arc::new(|| true);
            let resp = watch::serve(
                &set,
                &info,
                query,
                accept,
                watch::Start::Initial,
                keep_open.clone(),
            )
            .unwrap();
            let got = served(resp, enc, |evs| {
                evs.last()
                    .is_some_and(|e| objects::bookmark(enc, e).is_some())
            })
            .await;
            assert_eq!(
                added(&got),
                added(&events[..end]),
                "{name}: the initial events"
            );
            assert_eq!(added(&got).len(), 1035, "{name}");
            let mark = objects::bookmark(enc, got.last().unwrap()).unwrap();
            assert!(mark.initial_events_end, "{name}");
            assert_eq!(mark.rv, end_rv, "{name}");

            // The recorded changes after the end, then a watch resumed from the end.
            let after: Vec<Vec<u8>> = events[end + 1..]
                .iter()
                .filter(|e| objects::bookmark(enc, e).is_none())
                .cloned()
                .collect();
            assert!(
                !after.is_empty(),
                "{name}: changes were recorded after the end"
            );
            for e in &after {
                apply(&set, enc, e, &mut listing);
            }
            let resumed = format!(
                "allowWatchBookmarks=true&fieldSelector=spec.nodeName%3Dedge-node-1&resourceVersion={end_rv}&watch=true"
            );
            let resp = watch::serve(
                &set,
                &info,
                &resumed,
                accept,
                watch::Start::After(end_rv),
                keep_open,
            )
            .unwrap();
            let got = served(resp, enc, |evs| evs.len() >= after.len()).await;
            assert_eq!(got, after, "{name}: the changes after the end");
        }
    }

    #[test]
    fn json_lines_keep_an_incomplete_tail() {
        let (lines, used) = json_lines(b"{\"a\":1}\n{\"b\":2}\n{\"c\"");
        assert_eq!(lines, vec![&b"{\"a\":1}"[..], &b"{\"b\":2}"[..]]);
        assert_eq!(used, 16);
    }
}
