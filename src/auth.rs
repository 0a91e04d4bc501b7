//! Bearer-token auth shared by every front end.
//!
//! Tokens are compared in constant time (`subtle`) as SHA-256 digests, so neither a token's
//! contents nor its length shows in how long a check takes; no token is ever logged or echoed.
//! The accepted set can be replaced while skiff runs (the admin route), so a rotation needs no
//! restart; clones share it.

use std::sync::{Arc, RwLock};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The accepted client tokens (their digests). Empty means auth is off.
#[derive(Clone, Default)]
pub struct Auth {
    tokens: Arc<RwLock<Vec<[u8; 32]>>>,
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Auth({} tokens)", self.count())
    }
}

impl Auth {
    pub fn new(tokens: Vec<String>) -> Self {
        let auth = Self::default();
        auth.replace(tokens);
        auth
    }

    /// Accepts these tokens from now on, and no others.
    pub fn replace(&self, tokens: Vec<String>) {
        *self.tokens.write().expect("tokens") = tokens.iter().map(|t| digest(t.as_bytes())).collect();
    }

    pub fn count(&self) -> usize {
        self.tokens.read().expect("tokens").len()
    }

    pub fn enabled(&self) -> bool {
        self.count() > 0
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
        let tokens = self.tokens.read().expect("tokens");
        if tokens.is_empty() {
            return true;
        }
        // Digests have one length: `ct_eq` on slices of different lengths would return at
        // once, telling a caller how long the tokens are.
        let given = digest(token.as_bytes());
        let mut ok = subtle::Choice::from(0u8);
        for t in tokens.iter() {
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

    #[test]
    fn a_replaced_set_holds_for_every_clone() {
        let a = Auth::new(vec!["old".into()]);
        let b = a.clone();
        a.replace(vec!["new".into(), "newer".into()]);
        assert!(b.check_header(Some("Bearer new")) && b.check_header(Some("Bearer newer")));
        assert!(!b.check_header(Some("Bearer old")));
        assert_eq!(b.count(), 2);
    }
}
