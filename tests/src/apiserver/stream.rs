//! Streams: pods/log (optionally followed), and pods/exec + pods/attach over websocket
//! (v5.channel.k8s.io / v4.channel.k8s.io) or SPDY/3.1 (`spdy`) that echo stdin to stdout,
//! so upgrade passthrough can be tested end to end with either.
use std::{collections::HashMap, time::Duration};

use bytes::Bytes;
use hyper::{Request, Response, StatusCode, body::Incoming, header};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::mpsc,
};

use super::{
    State,
    http::{Body, Target, bad_request, full, status_error},
    resources, spdy,
    store::Key,
    watch::ChannelBody,
};

fn pod(state: &State, t: &Target) -> Result<std::sync::Arc<Value>, Response<Body>> {
    let name = t.name.clone().unwrap_or_default();
    state
        .store
        .get(&Key {
            resource: t.resource,
            namespace: t.namespace.clone().unwrap_or_default(),
            name: name.clone(),
        })
        .ok_or_else(|| {
            status_error(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("pods \"{name}\" not found"),
                None,
            )
        })
}

/// The container a log/exec request addresses, as kube-apiserver picks it.
fn container(pod: &Value, q: &HashMap<String, String>) -> Result<String, Response<Body>> {
    let names: Vec<String> = pod["spec"]["containers"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(|c| c["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    match q.get("container") {
        Some(c) if names.contains(c) => Ok(c.clone()),
        Some(c) => Err(bad_request(&format!(
            "container {c} is not valid for pod {}",
            pod["metadata"]["name"].as_str().unwrap_or_default()
        ))),
        None if names.len() == 1 => Ok(names[0].clone()),
        None if names.is_empty() => Ok("main".into()),
        None => Err(bad_request(&format!(
            "a container name must be specified for pod {}, choose one of: [{}]",
            pod["metadata"]["name"].as_str().unwrap_or_default(),
            names.join(" ")
        ))),
    }
}

/// Log lines: the pod's `standin.hub.dev/log` annotation, or numbered lines.
pub async fn logs(state: &State, t: &Target, q: &HashMap<String, String>) -> Response<Body> {
    let pod = match pod(state, t) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let container = match container(&pod, q) {
        Ok(c) => c,
        Err(e) => return e,
    };
    let name = pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut lines: Vec<String> =
        match pod["metadata"]["annotations"]["standin.hub.dev/log"].as_str() {
            Some(text) => text.lines().map(String::from).collect(),
            None => (1..=3)
                .map(|i| format!("{name}/{container} line {i}"))
                .collect(),
        };
    if let Some(n) = q.get("tailLines").and_then(|n| n.parse::<usize>().ok()) {
        lines = lines.split_off(lines.len().saturating_sub(n));
    }
    let follow = super::http::flag(q, "follow");
    let text_response = |body: Body| {
        Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "text/plain")
            .body(body)
            .expect("response")
    };
    let mut initial = lines.join("\n");
    if !initial.is_empty() {
        initial.push('\n');
    }
    if !follow {
        return text_response(full(initial));
    }
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        if tx.send(Bytes::from(initial)).await.is_err() {
            return;
        }
        // Followed logs grow one line every 100 ms for at most 10 minutes.
        for i in 1..=6000u32 {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = tx.closed() => return,
            }
            if tx
                .send(Bytes::from(format!("{name}/{container} follow {i}\n")))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    text_response(http_body_util::BodyExt::boxed(ChannelBody(rx)))
}

const WS_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
const CHANNEL_PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

fn accept_key(key: &str) -> String {
    use base64::Engine;
    use sha1::Digest;
    let mut h = sha1::Sha1::new();
    h.update(key.as_bytes());
    h.update(WS_GUID.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(h.finalize())
}

/// pods/exec and pods/attach: a websocket that echoes stdin to stdout; without stdin, the
/// command's words are written to stdout (like `echo`).
pub async fn exec(req: Request<Incoming>, t: &Target) -> Response<Body> {
    let _ = resources::get(t.resource);
    let headers = req.headers();
    let upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    if upgrade == "spdy/3.1" {
        return exec_spdy(req);
    }
    if upgrade != "websocket" {
        return status_error(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "Upgrade request required (websocket v5/v4.channel.k8s.io or SPDY/3.1)",
            None,
        );
    }
    let offered = headers
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let Some(protocol) = CHANNEL_PROTOCOLS
        .iter()
        .find(|p| offered.split(',').any(|o| o.trim() == **p))
    else {
        return bad_request(
            "no supported websocket subprotocol (want v5.channel.k8s.io or v4.channel.k8s.io)",
        );
    };
    let Some(key) = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .and_then(|v| v.to_str().ok())
    else {
        return bad_request("missing Sec-WebSocket-Key");
    };
    let accept = accept_key(key);
    let q = super::http::query(req.uri());
    let stdin = super::http::flag(&q, "stdin");
    let command = super::http::query_values(req.uri(), "command");
    let v5 = *protocol == "v5.channel.k8s.io";
    tokio::spawn(async move {
        let Ok(upgraded) = hyper::upgrade::on(req).await else {
            return;
        };
        let _ = echo_session(TokioIo::new(upgraded), stdin, command, v5).await;
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::UPGRADE, "websocket")
        .header(header::CONNECTION, "Upgrade")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept)
        .header(header::SEC_WEBSOCKET_PROTOCOL, *protocol)
        .body(full(Bytes::new()))
        .expect("response")
}

/// The SPDY/3.1 upgrade of exec/attach (`X-Stream-Protocol-Version` negotiated).
fn exec_spdy(req: Request<Incoming>) -> Response<Body> {
    let offered: Vec<String> = req
        .headers()
        .get_all("x-stream-protocol-version")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|p| p.trim().to_string()))
        .collect();
    let Some(protocol) = spdy::PROTOCOLS
        .iter()
        .find(|p| offered.iter().any(|o| o == *p))
    else {
        return bad_request(
            "no supported stream protocol (want v4.channel.k8s.io, v3 or v2 over SPDY/3.1)",
        );
    };
    let q = super::http::query(req.uri());
    let channels = spdy::Channels {
        stdin: super::http::flag(&q, "stdin"),
        stdout: super::http::flag(&q, "stdout"),
        stderr: super::http::flag(&q, "stderr"),
        tty: super::http::flag(&q, "tty"),
    };
    let command = super::http::query_values(req.uri(), "command");
    tokio::spawn(async move {
        let Ok(upgraded) = hyper::upgrade::on(req).await else {
            return;
        };
        let _ = spdy::echo_session(TokioIo::new(upgraded), channels, command).await;
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::UPGRADE, "SPDY/3.1")
        .header(header::CONNECTION, "Upgrade")
        .header("X-Stream-Protocol-Version", *protocol)
        .body(full(Bytes::new()))
        .expect("response")
}

async fn write_frame<W: AsyncWriteExt + Unpin>(
    w: &mut W,
    opcode: u8,
    payload: &[u8],
) -> std::io::Result<()> {
    let mut head = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => head.push(n as u8),
        n if n <= 0xffff => {
            head.push(126);
            head.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            head.push(127);
            head.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    w.write_all(&head).await?;
    w.write_all(payload).await?;
    w.flush().await
}

/// Reads one (unfragmented) client frame: (opcode, unmasked payload).
async fn read_frame<R: AsyncReadExt + Unpin>(r: &mut R) -> std::io::Result<(u8, Vec<u8>)> {
    let mut h = [0u8; 2];
    r.read_exact(&mut h).await?;
    let opcode = h[0] & 0x0f;
    let masked = h[1] & 0x80 != 0;
    let mut len = (h[1] & 0x7f) as u64;
    if len == 126 {
        let mut b = [0u8; 2];
        r.read_exact(&mut b).await?;
        len = u16::from_be_bytes(b) as u64;
    } else if len == 127 {
        let mut b = [0u8; 8];
        r.read_exact(&mut b).await?;
        len = u64::from_be_bytes(b);
    }
    if len > 1 << 20 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "frame too large",
        ));
    }
    let mut mask = [0u8; 4];
    if masked {
        r.read_exact(&mut mask).await?;
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload).await?;
    if masked {
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
    }
    Ok((opcode, payload))
}

async fn echo_session<S: AsyncReadExt + AsyncWriteExt + Unpin>(
    mut io: S,
    stdin: bool,
    command: Vec<String>,
    v5: bool,
) -> std::io::Result<()> {
    const STDIN: u8 = 0;
    const STDOUT: u8 = 1;
    const ERROR: u8 = 3;
    const CLOSE: u8 = 255;
    // Every stream starts with an empty frame per channel in the k8s protocol; kubectl does
    // not need them, so only data frames are sent.
    if !stdin {
        let mut out = vec![STDOUT];
        out.extend_from_slice(command.join(" ").as_bytes());
        out.push(b'\n');
        write_frame(&mut io, 2, &out).await?;
    } else {
        let started = tokio::time::Instant::now();
        loop {
            let frame = tokio::time::timeout(Duration::from_secs(60), read_frame(&mut io)).await;
            let Ok(Ok((opcode, payload))) = frame else {
                break;
            };
            match opcode {
                8 => break,                                     // close
                9 => write_frame(&mut io, 10, &payload).await?, // ping -> pong
                1 | 2 if !payload.is_empty() => match payload[0] {
                    STDIN if payload.len() > 1 => {
                        let mut out = vec![STDOUT];
                        out.extend_from_slice(&payload[1..]);
                        write_frame(&mut io, 2, &out).await?;
                    }
                    CLOSE if v5 && payload.get(1) == Some(&STDIN) => break,
                    _ => {}
                },
                _ => {}
            }
            if started.elapsed() > Duration::from_secs(600) {
                break;
            }
        }
    }
    let mut status = vec![ERROR];
    status.extend_from_slice(br#"{"metadata":{},"status":"Success"}"#);
    write_frame(&mut io, 2, &status).await?;
    write_frame(&mut io, 8, &1000u16.to_be_bytes()).await?;
    io.shutdown().await
}
