//! Who is asking and for what, as every front end sees it: peer, client IP, routing path, query and
//! token scope. It sits below the front ends and the dispatcher, so neither imports the other.

use std::net::SocketAddr;

use sluice_media::query::Query;

/// What a front end needs to know about the request besides the request itself.
#[derive(Debug, Clone)]
pub struct RequestContext {
    pub peer: SocketAddr,
    /// The client's IP (from `X-Forwarded-For` only behind a trusted proxy).
    pub client_ip: std::net::IpAddr,
    /// The query, with an encrypted token's params merged in (the token's win).
    pub query: Query,
    /// The path to route on, with any `/_token_<T>` prefix removed.
    pub path: String,
    /// The `Host` the client used, for absolute child URLs.
    pub host: Option<String>,
    /// The request came over TLS.
    pub secure: bool,
    /// Present when the request was authorized by an encrypted token.
    pub token: Option<TokenScope>,
}

/// The limits of the token a request came with; child tokens inherit them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenScope {
    pub exp: Option<u64>,
    pub ip: Option<String>,
    /// Path prefixes the token opens; `None` for a MediaFlow token, which proves the password.
    pub paths: Option<Vec<String>>,
}
