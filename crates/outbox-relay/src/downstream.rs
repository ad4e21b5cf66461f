//! One downstream API, from its two variables: where it is, and the
//! credential its calls carry.

use process::Secret;

/// One downstream API: its base URL, without a user or password, and the
/// `Authorization` header its calls carry. `Debug` shows no credential.
#[derive(Debug, Clone)]
pub struct Downstream {
    /// `http(s)://host[:port][/path]`: no user or password, query or fragment.
    pub base_url: reqwest::Url,
    /// `{PREFIX}_AUTHORIZATION`, or HTTP Basic from the URL's user and password.
    pub authorization: Option<Secret<String>>,
}

impl Downstream {
    /// From `{prefix}_URL` and `{prefix}_AUTHORIZATION`. No error message
    /// quotes either value: the URL may hold a password.
    pub(crate) fn new(
        url: Option<&Secret<String>>,
        authorization: Option<&Secret<String>>,
        prefix: &str,
    ) -> Result<Self, String> {
        let variable = format!("{prefix}_URL");
        let url = url
            .map(Secret::expose)
            .filter(|u| !u.is_empty())
            .ok_or_else(|| format!("{variable} is required (the API's base URL, http(s)://...)"))?;
        let mut parsed = reqwest::Url::parse(url).map_err(|e| format!("{variable} is not a URL: {e}"))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            return Err(format!("{variable} must be an http(s) URL with a host"));
        }
        if parsed.query().is_some() || parsed.fragment().is_some() {
            return Err(format!("{variable} must not have a query or a fragment"));
        }
        let from_url = (!parsed.username().is_empty() || parsed.password().is_some()).then(|| {
            let user = percent_decode(parsed.username());
            let password = parsed.password().map(percent_decode).unwrap_or_default();
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            basic(&user, &password)
        });
        let authorization = match (authorization.filter(|a| !a.expose().is_empty()), from_url) {
            (Some(_), Some(_)) => {
                return Err(format!(
                    "{variable} has a user and password and {prefix}_AUTHORIZATION is set: use one"
                ));
            }
            (Some(given), None) => {
                if reqwest::header::HeaderValue::from_str(given.expose()).is_err() {
                    return Err(format!(
                        "{prefix}_AUTHORIZATION is not a valid header value (visible ASCII, no line breaks)"
                    ));
                }
                Some(given.clone())
            }
            (None, from_url) => from_url,
        };
        Ok(Self {
            base_url: parsed,
            authorization,
        })
    }
}

/// `Basic base64(user:password)`, as RFC 7617 (and reqwest for a URL's userinfo) has it.
fn basic(user: &str, password: &str) -> Secret<String> {
    use base64::Engine as _;
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    Secret::new(format!("Basic {token}"))
}

/// A URL's percent-encoded user or password, decoded (invalid escapes kept as they are).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
