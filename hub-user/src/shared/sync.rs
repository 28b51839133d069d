//! Keeps one shared set equal to the cloud's: one list (in pages) as the node, then one
//! watch from its resourceVersion with bookmarks, resumed where it ended; listed again
//! only when the cloud can no longer resume it (410 Gone). All in protobuf, the encoding
//! the node's clients read.
use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::sync::watch;

use super::set::{Set, State};
use crate::{
    cache::objects::{self, Encoding, EventType},
    coordinator::cloud_get::{GetError, get_as_node_in},
    kproto,
    upstream::cloud::Cloud,
};

const USER_AGENT: &str = "hub/node-watch-cache";
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
/// Pages of the list.
const PAGE: usize = 500;
/// A list page or one watch event larger than this is refused.
const MAX_ANSWER: usize = 64 * 1024 * 1024;
/// How long one watch request to the cloud stays open.
const WATCH_SECONDS: u64 = 300;
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
}

impl From<GetError> for Stop {
    fn from(e: GetError) -> Stop {
        match e.status.map(|s| s.as_u16()) {
            Some(401 | 403) => Stop::Refused(e.message),
            Some(410) => Stop::Relist,
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
    let mut listed = false;
    loop {
        while !cloud.healthy() {
            if sleep(CLOUD_CHECK, &mut stop).await {
                return;
            }
        }
        let step = async {
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
            Stop::Relist => {
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
                set.set_state(State::Broken(why));
                RETRY
            }
        };
        if sleep(wait, &mut stop).await {
            return;
        }
    }
}

/// Lists the resource (all pages) and makes the set exactly that.
async fn list(set: &Set, cloud: &Cloud, path: &str) -> Result<(), Stop> {
    let (mut items, mut rv, mut cont) = (Vec::new(), 0, String::new());
    loop {
        let mut q = format!("{path}?limit={PAGE}");
        if !cont.is_empty() {
            q.push_str("&continue=");
            q.push_str(&crate::proxy::request::percent_encode(&cont));
        }
        let resp = get_as_node_in(cloud, &q, USER_AGENT, PROTOBUF).await?;
        let pieces = read_all(resp.into_body()).await?;
        let enc = if pieces.first().is_some_and(|p| p.starts_with(kproto::MAGIC)) {
            Encoding::Protobuf
        } else {
            Encoding::Json
        };
        let page = objects::parse_list_pieces(&set.resource, enc, &pieces, |_| false)
            .map_err(|e| Stop::Failed(format!("the cloud's list: {e}")))?;
        if page.bad > 0 {
            return Err(Stop::Failed(format!(
                "the cloud's list held {} objects the hub cannot read",
                page.bad
            )));
        }
        if rv == 0 {
            rv = page.rv;
        }
        items.extend(page.items);
        cont = page.continue_token;
        if cont.is_empty() {
            break;
        }
    }
    tracing::info!(
        gvr = set.gvr,
        rv,
        objects = items.len(),
        "node-level watch cache: listed from the cloud"
    );
    set.replace(items, rv);
    Ok(())
}

async fn read_all(body: crate::body::ProxyBody) -> Result<Vec<Bytes>, Stop> {
    let mut body = http_body_util::Limited::new(body, MAX_ANSWER);
    let mut pieces = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Stop::Failed(format!("reading the cloud's list: {e}")))?;
        if let Ok(data) = frame.into_data() {
            pieces.push(data);
        }
    }
    Ok(pieces)
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
        if let Err(stop) = follow(set, resp, Until::End).await {
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
            Ok(Err(Stop::Relist)) | Err(_) => {}
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
    follow(set, resp, Until::Bookmark).await
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
            match apply(set, enc, event) {
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

/// Applies one event.
fn apply(set: &Set, enc: Encoding, event: &[u8]) -> Applied {
    if let Some(mark) = objects::bookmark(enc, event) {
        set.advance(mark.rv);
        return Applied::Bookmark;
    }
    match objects::parse_event(&set.resource, enc, event) {
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

    #[test]
    fn json_lines_keep_an_incomplete_tail() {
        let (lines, used) = json_lines(b"{\"a\":1}\n{\"b\":2}\n{\"c\"");
        assert_eq!(lines, vec![&b"{\"a\":1}"[..], &b"{\"b\":2}"[..]]);
        assert_eq!(used, 16);
    }
}
