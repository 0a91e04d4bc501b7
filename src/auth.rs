//! Bearer-token auth shared by every front end.
//!
//! Tokens are compared in constant time (`subtle`) as SHA-256 digests, so neither a token's
//! contents nor its length shows in how long a check takes; no token is ever logged or echoed.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The accepted client tokens (their digests). Empty means auth is off.
#[derive(Clone, Default)]
pub struct Auth {
    tokens: Vec<[u8; 32]>,
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Auth({} tokens)", self.tokens.len())
    }
}

impl Auth {
    pub fn new(tokens: Vec<String>) -> Self {
        Self { tokens: tokens.iter().map(|t| digest(t.as_bytes())).collect() }
    }

    pub fn enabled(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// Checks an `Authorization` header value (`Bearer <token>`).
    pub fn check_header(&self, header: Option<&str>) -> bool {
        if !self.enabled() {
            return true;
        }
        let Some(h) = header else { return false };
        let Some((scheme, token)) = h.trim().split_once(' ') else {
            return false;
        };
        scheme.eq_ignore_ascii_case("bearer") && self.check_token(token.trim())
    }

    /// Checks a bare token against every accepted one, without stopping at the first match,
    /// so timing reveals neither which token matched nor how much of one did.
    pub fn check_token(&self, token: &str) -> bool {
        if !self.enabled() {
            return true;
        }
        // Digests have one length: `ct_eq` on slices of different lengths would return at
        // once, telling a caller how long the tokens are.
        let given = digest(token.as_bytes());
        let mut ok = subtle::Choice::from(0u8);
        for t in &self.tokens {
            ok |= t.ct_eq(&given);
        }
        ok.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens() {
        let a = Auth::new(vec!["old".into(), "new".into()]);
        assert!(a.check_header(Some("Bearer new")));
        assert!(a.check_header(Some("bearer old")));
        assert!(!a.check_header(Some("Bearer ne")));
        assert!(!a.check_header(Some("Basic new")));
        assert!(!a.check_header(Some("Bearer")));
        assert!(!a.check_header(None));
        assert!(Auth::default().check_header(None));
    }
}
