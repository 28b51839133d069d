//! Answer bodies as the proxy passes them on, whatever produced them (the cloud, the
//! cache, the coordinator), and why one could not be read to its end.
use bytes::Bytes;
use http_body_util::combinators::BoxBody;

pub type ProxyBody = BoxBody<Bytes, BodyError>;

/// Why an answer's body could not be read to its end. A concrete type rather than a boxed
/// error: rustc cannot prove boxed trait objects general enough inside spawned futures.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BodyError(String);

impl From<hyper::Error> for BodyError {
    fn from(e: hyper::Error) -> Self {
        BodyError(source_chain(&e))
    }
}

impl From<h2::Error> for BodyError {
    fn from(e: h2::Error) -> Self {
        BodyError(source_chain(&e))
    }
}

impl BodyError {
    pub fn new(reason: impl Into<String>) -> BodyError {
        BodyError(reason.into())
    }
}

/// An error and its causes on one line.
pub fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// A body that yields the given pieces (and fails where a piece is an error), as a
/// connection would deliver them: for tests of what wraps a body.
#[cfg(test)]
pub struct TestFrames(pub std::collections::VecDeque<Result<Bytes, BodyError>>);

#[cfg(test)]
impl hyper::body::Body for TestFrames {
    type Data = Bytes;
    type Error = BodyError;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, BodyError>>> {
        std::task::Poll::Ready(self.0.pop_front().map(|f| f.map(hyper::body::Frame::data)))
    }
}
