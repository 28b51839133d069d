//! pods/exec and pods/attach over SPDY/3.1 (the `v4.channel.k8s.io` family), as clients
//! that do not use websockets speak it (client-go's remotecommand, kubectl with
//! KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false): the client opens one stream per channel —
//! error, then stdin, stdout, stderr as the request asks for them, then resize with a tty
//! — each answered with a SYN_REPLY; stdin is echoed to stdout; when stdin ends (or at
//! once without stdin, writing the command's words) the output streams and the error
//! stream end, which the client reads as success.
//!
//! Frames follow the SPDY/3.1 draft: 8-byte headers, control frames with the C bit. Header
//! blocks are zlib streams (one per direction and connection). The client's are
//! compressed with the SPDY dictionary; the stand-in does not inflate them but knows each
//! stream's channel from the order client-go opens them in. Its own (empty) header
//! blocks are valid zlib made of stored deflate blocks, which needs no dictionary.
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

const VERSION: u16 = 3;
const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const FLAG_FIN: u8 = 0x01;
/// Frames larger than this are refused (the stand-in only echoes small inputs).
const MAX_FRAME: usize = 1 << 20;

/// The protocols offered in X-Stream-Protocol-Version that this session speaks.
pub const PROTOCOLS: [&str; 3] = [
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
];

enum Frame {
    Control {
        kind: u16,
        data: Vec<u8>,
    },
    Data {
        stream: u32,
        flags: u8,
        data: Vec<u8>,
    },
}

async fn read_frame<R: AsyncReadExt + Unpin>(r: &mut R) -> std::io::Result<Frame> {
    let mut h = [0u8; 8];
    r.read_exact(&mut h).await?;
    let flags = h[4];
    let len = u32::from_be_bytes([0, h[5], h[6], h[7]]) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "SPDY frame too large",
        ));
    }
    let mut data = vec![0u8; len];
    r.read_exact(&mut data).await?;
    Ok(if h[0] & 0x80 != 0 {
        Frame::Control {
            kind: u16::from_be_bytes([h[2], h[3]]),
            data,
        }
    } else {
        Frame::Data {
            stream: u32::from_be_bytes([h[0], h[1], h[2], h[3]]) & 0x7fff_ffff,
            flags,
            data,
        }
    })
}

fn control(kind: u16, flags: u8, data: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + data.len());
    f.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
    f.extend_from_slice(&kind.to_be_bytes());
    f.push(flags);
    f.extend_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(data);
    f
}

fn data_frame(stream: u32, flags: u8, data: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + data.len());
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.push(flags);
    f.extend_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(data);
    f
}

/// The server's side of the header-block zlib stream: a zlib header once, then each block
/// as one stored (uncompressed) deflate block — valid zlib a client inflates as is.
struct HeaderWriter {
    started: bool,
}

impl HeaderWriter {
    /// A header block with no headers (the k8s protocols need none in replies).
    fn empty_block(&mut self) -> Vec<u8> {
        let raw = 0u32.to_be_bytes(); // number of name/value pairs
        let mut out = Vec::new();
        if !self.started {
            // CMF 0x78 (deflate, 32 KiB window), FLG 0x01: no preset dictionary, check ok.
            out.extend_from_slice(&[0x78, 0x01]);
            self.started = true;
        }
        for data in [&raw[..], &[]] {
            // A stored block, not final; the empty one after it is zlib's sync flush,
            // which tells the client's inflater to hand over what it has.
            let len = data.len() as u16;
            out.push(0x00);
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&(!len).to_le_bytes());
            out.extend_from_slice(data);
        }
        out
    }
}

/// Which channels the client opens, in the order client-go opens them.
pub struct Channels {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

impl Channels {
    fn order(&self) -> Vec<&'static str> {
        let mut o = vec!["error"];
        for (on, name) in [
            (self.stdin, "stdin"),
            (self.stdout, "stdout"),
            (self.stderr && !self.tty, "stderr"),
            (self.tty, "resize"),
        ] {
            if on {
                o.push(name);
            }
        }
        o
    }
}

/// Runs one exec session over an upgraded connection.
pub async fn echo_session<S: AsyncReadExt + AsyncWriteExt + Unpin>(
    mut io: S,
    channels: Channels,
    command: Vec<String>,
) -> std::io::Result<()> {
    let order = channels.order();
    let mut headers = HeaderWriter { started: false };
    // channel name -> stream id, as the client opens them.
    let mut streams: Vec<(&'static str, u32)> = Vec::new();
    let id_of = |streams: &[(&str, u32)], name: &str| {
        streams.iter().find(|(n, _)| *n == name).map(|(_, id)| *id)
    };
    let mut stdin_open = channels.stdin;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    loop {
        // Every channel is open and stdin (if any) has ended: finish.
        if streams.len() == order.len() && !stdin_open {
            break;
        }
        let frame = tokio::time::timeout_at(deadline, read_frame(&mut io)).await;
        let Ok(Ok(frame)) = frame else { break };
        match frame {
            Frame::Control {
                kind: SYN_STREAM,
                data,
                ..
            } if data.len() >= 10 => {
                let id = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) & 0x7fff_ffff;
                let Some(name) = order.get(streams.len()) else {
                    // A channel this request did not ask for: refuse it (RST_STREAM,
                    // PROTOCOL_ERROR).
                    let mut rst = id.to_be_bytes().to_vec();
                    rst.extend_from_slice(&1u32.to_be_bytes());
                    io.write_all(&control(RST_STREAM, 0, &rst)).await?;
                    continue;
                };
                streams.push((name, id));
                let mut reply = id.to_be_bytes().to_vec();
                reply.extend_from_slice(&headers.empty_block());
                io.write_all(&control(SYN_REPLY, 0, &reply)).await?;
                io.flush().await?;
                if streams.len() == order.len() && !channels.stdin {
                    // Without stdin the command's words are the output, like `echo`.
                    if let Some(out) = id_of(&streams, "stdout") {
                        let line = format!("{}\n", command.join(" "));
                        io.write_all(&data_frame(out, 0, line.as_bytes())).await?;
                    }
                }
            }
            Frame::Control {
                kind: PING, data, ..
            } => {
                io.write_all(&control(PING, 0, &data)).await?;
            }
            Frame::Control { kind: GOAWAY, .. } => return Ok(()),
            Frame::Control { .. } => {} // SETTINGS, WINDOW_UPDATE, RST_STREAM, HEADERS
            Frame::Data {
                stream,
                flags,
                data,
            } => {
                if Some(stream) == id_of(&streams, "stdin") {
                    if !data.is_empty()
                        && let Some(out) = id_of(&streams, "stdout")
                    {
                        io.write_all(&data_frame(out, 0, &data)).await?;
                    }
                    if flags & FLAG_FIN != 0 {
                        stdin_open = false;
                    }
                }
            }
        }
        io.flush().await?;
    }
    // End the output channels, then the error channel with nothing in it: success.
    for name in ["stdout", "stderr", "error"] {
        if let Some(id) = id_of(&streams, name) {
            io.write_all(&data_frame(id, FLAG_FIN, &[])).await?;
        }
    }
    io.flush().await?;
    // Give the client a moment to read before the connection goes.
    let mut rest = [0u8; 512];
    let _ = tokio::time::timeout(Duration::from_secs(2), io.read(&mut rest)).await;
    io.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_header_blocks_have_the_wire_shape() {
        let c = control(SYN_REPLY, 0, &[0, 0, 0, 1]);
        assert_eq!(&c[..8], &[0x80, 0x03, 0x00, 0x02, 0x00, 0x00, 0x00, 0x04]);
        let d = data_frame(3, FLAG_FIN, b"hi");
        assert_eq!(&d, &[0, 0, 0, 3, 1, 0, 0, 2, b'h', b'i']);
        let mut w = HeaderWriter { started: false };
        let first = w.empty_block();
        assert_eq!(&first[..2], &[0x78, 0x01]);
        assert_eq!((0x78u16 * 256 + 0x01) % 31, 0, "a valid zlib header check");
        let block = [0x00, 4, 0, 0xfb, 0xff, 0, 0, 0, 0, 0x00, 0, 0, 0xff, 0xff];
        assert_eq!(&first[2..], &block);
        assert_eq!(w.empty_block(), block);
        let order = Channels {
            stdin: true,
            stdout: true,
            stderr: true,
            tty: false,
        }
        .order();
        assert_eq!(order, ["error", "stdin", "stdout", "stderr"]);
        let order = Channels {
            stdin: true,
            stdout: true,
            stderr: true,
            tty: true,
        }
        .order();
        assert_eq!(order, ["error", "stdin", "stdout", "resize"]);
    }
}
