//! Signing in: the operator's name and the console's token
//! (`CONSOLE_TOKEN`, compared in constant time) open a session, held here in
//! memory and named by a random id in an `HttpOnly`, `SameSite=Strict`
//! cookie. Every form that changes something carries the session's CSRF
//! token, checked in constant time too. A restart signs everyone out.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use actix_web::HttpRequest;
use rand::RngCore as _;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use crate::config::CookieTransport;

/// The session cookie's name.
pub const COOKIE: &str = "ops_console_session";
/// The longest operator name kept (it is written to the log with every action): an email address.
pub const MAX_OPERATOR_CHARS: usize = 254;

/// A signed-in operator.
#[derive(Debug, Clone)]
pub struct Session {
    pub operator: String,
    /// The token every form that changes something must carry.
    pub csrf: String,
    expires: Instant,
}

/// The sessions open now, by the SHA-256 of their id (a leaked memory dump
/// or log line of the map names no usable cookie).
pub struct Sessions {
    open: Mutex<HashMap<[u8; 32], Session>>,
    ttl: Duration,
    token_digest: [u8; 32],
    cookie: CookieTransport,
}

fn digest(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// Why a sign-in was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    WrongToken,
    BadName,
}

impl Sessions {
    pub fn new(token: &str, ttl: Duration, cookie: CookieTransport) -> Self {
        Self {
            open: Mutex::new(HashMap::new()),
            ttl,
            token_digest: digest(token.trim()),
            cookie,
        }
    }

    /// A new session for `operator` if `token` is the console's, and the
    /// `Set-Cookie` value that names it.
    pub fn sign_in(&self, operator: &str, token: &str) -> Result<(Session, String), Refused> {
        // Both digests are 32 bytes: the comparison takes the same time
        // whatever the token, and its length leaks nothing.
        if !bool::from(digest(token.trim()).ct_eq(&self.token_digest)) {
            return Err(Refused::WrongToken);
        }
        let operator = operator.trim();
        if operator.is_empty()
            || operator.chars().count() > MAX_OPERATOR_CHARS
            || operator.chars().any(char::is_control)
        {
            return Err(Refused::BadName);
        }
        let id = random_hex();
        let session = Session {
            operator: operator.to_owned(),
            csrf: random_hex(),
            expires: Instant::now() + self.ttl,
        };
        let mut open = self.open.lock().expect("the sessions' lock is never poisoned");
        let now = Instant::now();
        open.retain(|_, s| s.expires > now);
        open.insert(digest(&id), session.clone());
        drop(open);
        Ok((session, self.cookie_value(&id, self.ttl.as_secs())))
    }

    /// The session the request's cookie names, if it is open.
    pub fn of(&self, req: &HttpRequest) -> Option<Session> {
        let id = cookie(req)?;
        let mut open = self.open.lock().expect("the sessions' lock is never poisoned");
        let key = digest(&id);
        match open.get(&key) {
            Some(s) if s.expires > Instant::now() => Some(s.clone()),
            Some(_) => {
                open.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Ends the request's session; the `Set-Cookie` value that clears it.
    pub fn sign_out(&self, req: &HttpRequest) -> String {
        if let Some(id) = cookie(req) {
            self.open
                .lock()
                .expect("the sessions' lock is never poisoned")
                .remove(&digest(&id));
        }
        self.cookie_value("", 0)
    }

    fn cookie_value(&self, id: &str, max_age: u64) -> String {
        let secure = match self.cookie {
            CookieTransport::Secure => "; Secure",
            CookieTransport::PlainHttp => "",
        };
        format!("{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}")
    }
}

/// Whether `given` is the session's CSRF token (constant time).
pub fn csrf_matches(session: &Session, given: &str) -> bool {
    given.len() == session.csrf.len() && bool::from(given.as_bytes().ct_eq(session.csrf.as_bytes()))
}

/// The session id the request's `Cookie` header carries.
fn cookie(req: &HttpRequest) -> Option<String> {
    req.headers()
        .get_all(actix_web::http::header::COOKIE)
        .filter_map(|h| h.to_str().ok())
        .flat_map(|h| h.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
        .filter(|value| value.len() == 64 && value.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions() -> Sessions {
        Sessions::new(
            "a-token-of-32-characters-or-so!!",
            Duration::from_secs(60),
            CookieTransport::Secure,
        )
    }

    #[test]
    fn only_the_token_signs_in_and_the_cookie_is_httponly_strict() {
        let s = sessions();
        assert_eq!(s.sign_in("ann", "wrong").unwrap_err(), Refused::WrongToken);
        assert_eq!(
            s.sign_in(" ", "a-token-of-32-characters-or-so!!").unwrap_err(),
            Refused::BadName
        );
        let (session, cookie) = s.sign_in("ann", "a-token-of-32-characters-or-so!!").unwrap();
        assert_eq!(session.operator, "ann");
        assert!(cookie.contains("HttpOnly; SameSite=Strict"), "{cookie}");
        assert!(cookie.ends_with("; Secure"), "{cookie}");
        assert!(csrf_matches(&session, &session.csrf));
        assert!(!csrf_matches(&session, "0"));
    }
}
