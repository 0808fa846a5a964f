//! Bearer-token authentication of the HTTP API (`--http-token-file`).
//!
//! With a token, every request that changes something (any method but `GET`,
//! `HEAD` and `OPTIONS`: `PUT`, `DELETE`, `POST /reload`) must carry
//! `Authorization: Bearer <token>`; with [`Protect::Everything`]
//! (`--http-token-reads`) every request must. Otherwise the answer is `401` with
//! `WWW-Authenticate: Bearer realm="dwara"` (plus `error="invalid_token"` when a
//! token was given but is wrong), and the request never reaches a handler. The
//! token is compared in constant time (`subtle`); only its length can show.
//!
//! The token file holds one token: printable ASCII without spaces, 16 to 4096
//! characters, surrounding white space (a trailing newline) ignored. `dwara keygen`
//! prints a suitable one. A file readable by group or others is accepted with a
//! warning, as the cluster key is.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use subtle::ConstantTimeEq;

/// The shortest token accepted.
pub const MIN_TOKEN_LEN: usize = 16;
/// The longest token accepted.
pub const MAX_TOKEN_LEN: usize = 4096;

/// Why a token file was not accepted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// The file could not be read.
    #[error("cannot read the HTTP token file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The file's content is not a usable token.
    #[error("HTTP token file {}: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: TokenProblem,
    },
}

/// What is wrong with a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenProblem {
    /// Nothing but white space.
    #[error("the file is empty (put a token in it, e.g. the output of `dwara keygen`)")]
    Empty,
    /// Shorter than [`MIN_TOKEN_LEN`].
    #[error("the token is shorter than 16 characters (use e.g. the output of `dwara keygen`)")]
    TooShort,
    /// Longer than [`MAX_TOKEN_LEN`].
    #[error("the token is longer than 4096 characters")]
    TooLong,
    /// A space, a control character or a non-ASCII byte inside the token (an
    /// HTTP header could not carry it).
    #[error("the token must be one word of printable ASCII (no spaces or control characters)")]
    BadCharacter,
}

/// A bearer token. Its `Debug` does not show it.
#[derive(Clone)]
pub struct Token(Box<[u8]>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// The token in a token file's bytes (surrounding white space ignored).
    pub fn parse(content: &[u8]) -> Result<Self, TokenProblem> {
        let token = content.trim_ascii();
        if token.is_empty() {
            return Err(TokenProblem::Empty);
        }
        if !token.iter().all(|b| b.is_ascii_graphic()) {
            return Err(TokenProblem::BadCharacter);
        }
        if token.len() < MIN_TOKEN_LEN {
            return Err(TokenProblem::TooShort);
        }
        if token.len() > MAX_TOKEN_LEN {
            return Err(TokenProblem::TooLong);
        }
        Ok(Self(token.into()))
    }

    /// Reads and checks a token file.
    pub fn load(path: &Path) -> Result<Self, TokenError> {
        let content = std::fs::read(path).map_err(|source| TokenError::Read {
            path: path.to_owned(),
            source,
        })?;
        let token = Self::parse(&content).map_err(|reason| TokenError::Invalid {
            path: path.to_owned(),
            reason,
        })?;
        warn_if_readable_by_others(path);
        Ok(token)
    }

    /// Whether `presented` is this token, in time independent of where they differ.
    pub fn matches(&self, presented: &[u8]) -> bool {
        bool::from(self.0.ct_eq(presented))
    }

    /// The `Authorization` header value that carries this token.
    pub fn header_value(&self) -> String {
        format!("Bearer {}", String::from_utf8_lossy(&self.0))
    }
}

#[cfg(unix)]
fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            path = %path.display(),
            mode = format_args!("{:o}", meta.permissions().mode() & 0o777),
            "HTTP token file is readable by group or others; chmod 600 it"
        );
    }
}

#[cfg(not(unix))]
fn warn_if_readable_by_others(_path: &Path) {}

/// The token of an `Authorization` header value: `Bearer <token>` (the scheme in
/// any case, one or more spaces, trailing white space ignored). `None` for another
/// scheme, no token, or a token with a space inside.
pub fn bearer(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer";
    let value = value.trim_ascii_end();
    if value.len() <= SCHEME.len() || !value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    let rest = &value[SCHEME.len()..];
    let token = rest.trim_ascii_start();
    if token.len() == rest.len() || token.is_empty() || token.iter().any(|b| !b.is_ascii_graphic())
    {
        return None;
    }
    Some(token)
}

/// Which requests need the token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Protect {
    /// Requests that change something (any method but GET, HEAD, OPTIONS).
    #[default]
    Writes,
    /// Every request (`--http-token-reads`).
    Everything,
}

/// The HTTP API's authentication: the token, what it protects, and counts of
/// refused requests.
#[derive(Debug)]
pub struct Auth {
    token: Token,
    protect: Protect,
    missing: AtomicU64,
    wrong: AtomicU64,
}

impl Auth {
    /// Requests `protect` covers need `token`.
    pub fn new(token: Token, protect: Protect) -> Arc<Self> {
        Arc::new(Self {
            token,
            protect,
            missing: AtomicU64::new(0),
            wrong: AtomicU64::new(0),
        })
    }

    fn covers(&self, method: &Method) -> bool {
        match self.protect {
            Protect::Everything => true,
            Protect::Writes => !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS),
        }
    }

    /// The collector of `dwara_http_unauthorized{reason}`.
    pub fn collector(self: &Arc<Self>) -> AuthCollector {
        AuthCollector(self.clone())
    }
}

fn unauthorized(challenge: &'static str, message: &'static str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, challenge)],
        message,
    )
        .into_response()
}

/// The middleware: passes what the token covers only with the token.
pub async fn require_token(State(auth): State<Arc<Auth>>, req: Request, next: Next) -> Response {
    if !auth.covers(req.method()) {
        return next.run(req).await;
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| bearer(v.as_bytes()));
    match presented {
        Some(Some(token)) if auth.token.matches(token) => next.run(req).await,
        Some(Some(_)) => {
            auth.wrong.fetch_add(1, Relaxed);
            tracing::debug!(method = %req.method(), path = %req.uri().path(), "HTTP request with a wrong bearer token refused");
            unauthorized(
                r#"Bearer realm="dwara", error="invalid_token""#,
                "wrong bearer token\n",
            )
        }
        _ => {
            auth.missing.fetch_add(1, Relaxed);
            tracing::debug!(method = %req.method(), path = %req.uri().path(), "HTTP request without a bearer token refused");
            unauthorized(
                r#"Bearer realm="dwara""#,
                "this request needs Authorization: Bearer <token> (see --http-token-file)\n",
            )
        }
    }
}

/// `dwara_http_unauthorized{reason="missing"|"wrong"}`: requests refused with 401.
#[derive(Debug)]
pub struct AuthCollector(Arc<Auth>);

impl Collector for AuthCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "dwara_http_unauthorized",
            "HTTP requests refused with 401, by reason (no bearer token, or a wrong one)",
            None,
            MetricType::Counter,
        )?;
        for (reason, counter) in [("missing", &self.0.missing), ("wrong", &self.0.wrong)] {
            ConstCounter::new(counter.load(Relaxed))
                .encode(family.encode_family(&[("reason", reason)])?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_files() {
        let t = Token::parse(b"  0123456789abcdef-XYZ+/=\n").unwrap();
        assert!(t.matches(b"0123456789abcdef-XYZ+/="));
        assert!(!t.matches(b"0123456789abcdef-XYZ+/"));
        assert!(!t.matches(b""));
        assert_eq!(t.header_value(), "Bearer 0123456789abcdef-XYZ+/=");
        assert_eq!(format!("{t:?}"), "Token(<redacted>)");
        for (content, problem) in [
            (&b""[..], TokenProblem::Empty),
            (b" \n\t\n", TokenProblem::Empty),
            (b"short", TokenProblem::TooShort),
            (b"0123456789 abcdef", TokenProblem::BadCharacter),
            (b"0123456789abcdef\n0123", TokenProblem::BadCharacter),
            ("0123456789abcdéf".as_bytes(), TokenProblem::BadCharacter),
            (&[b'x'; MAX_TOKEN_LEN + 1], TokenProblem::TooLong),
        ] {
            assert_eq!(Token::parse(content).unwrap_err(), problem, "{content:?}");
        }
    }

    #[test]
    fn a_token_file_error_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let e = Token::load(&missing).unwrap_err().to_string();
        assert!(
            e.contains("cannot read the HTTP token file") && e.contains("nope"),
            "{e}"
        );
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let e = Token::load(&empty).unwrap_err().to_string();
        assert!(e.contains("empty") && e.contains("dwara keygen"), "{e}");
    }

    #[test]
    fn authorization_headers() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer   abc  "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"BEARER abc"), Some(&b"abc"[..]));
        for bad in [
            &b""[..],
            b"Bearer",
            b"Bearer ",
            b"Bearerabc",
            b"Basic abc",
            b"Bearer a b",
            b"Bearer a\x01",
            b" Bearer abc",
        ] {
            assert_eq!(bearer(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
