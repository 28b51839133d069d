//! The cloud side: apiserver endpoints, their health, and the pooled HTTP clients that
//! reach them over sockets carrying the bypass mark (so the hub's own connections are
//! never redirected back to itself).
pub mod channel;
pub mod cloud;
pub mod connect;
pub mod health;
pub mod identity;
pub mod server;

pub use cloud::{Cloud, UpstreamError};
pub use connect::connect_marked;

/// `scheme://host:port[/path]` of a cloud apiserver or etcd member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerUrl {
    pub scheme: String,
    pub host: String,
    pub port: u16,
}

impl ServerUrl {
    pub fn parse(s: &str) -> Result<ServerUrl, String> {
        let (scheme, rest) = s
            .split_once("://")
            .ok_or_else(|| format!("`{s}` is not a URL (scheme://host:port)"))?;
        let default_port = match scheme {
            "https" => 443,
            "http" => 80,
            _ => return Err(format!("`{s}`: scheme must be http or https")),
        };
        let authority = rest.split('/').next().unwrap_or_default();
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("`{s}`: unclosed `[`"))?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| format!("`{s}`: bad port"))?,
                None if after.is_empty() => default_port,
                None => return Err(format!("`{s}`: junk after host")),
            };
            (h.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (
                    h.to_string(),
                    p.parse().map_err(|_| format!("`{s}`: bad port"))?,
                ),
                None => (authority.to_string(), default_port),
            }
        };
        if host.is_empty() {
            return Err(format!("`{s}`: empty host"));
        }
        Ok(ServerUrl {
            scheme: scheme.to_string(),
            host,
            port,
        })
    }

    /// `host:port` with IPv6 hosts bracketed, for resolution.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_server_urls() {
        let u = ServerUrl::parse("https://10.0.0.10:6443").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("10.0.0.10", 6443));
        let u = ServerUrl::parse("https://[::1]:6443/").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.authority()),
            ("::1", 6443, "[::1]:6443".into())
        );
        assert_eq!(ServerUrl::parse("http://etcd").unwrap().port, 80);
        assert!(ServerUrl::parse("ftp://x:1").is_err());
        assert!(ServerUrl::parse("https://:1").is_err());
        assert!(ServerUrl::parse("https://a:99999").is_err());
        assert!(ServerUrl::parse("a:1").is_err());
    }
}
