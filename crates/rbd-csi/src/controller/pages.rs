//! Pagination of `ListVolumes` and `ListSnapshots`: entries ordered by ID, a page starts strictly
//! after the token (the last ID of the previous page), so a token stays valid when its entry or
//! any other was deleted between pages.

use tonic::Status;

/// `max_entries` as a count (0: no limit); negative is `INVALID_ARGUMENT`.
pub(super) fn max_entries(max_entries: i32) -> Result<usize, Status> {
    usize::try_from(max_entries).map_err(|_| {
        Status::invalid_argument(format!(
            "max_entries must not be negative, got {max_entries}"
        ))
    })
}

/// The page of `entries` after `token` with at most `max` entries (0: all), and the next token
/// (empty when this is the last page).
pub(super) fn page<T>(
    mut entries: Vec<T>,
    id: impl Fn(&T) -> &str,
    token: &str,
    max: usize,
) -> (Vec<T>, String) {
    entries.sort_by(|a, b| id(a).cmp(id(b)));
    if !token.is_empty() {
        entries.retain(|e| id(e) > token);
    }
    if max > 0 && entries.len() > max {
        entries.truncate(max);
        let next = entries.last().map(|e| id(e).to_owned()).unwrap_or_default();
        (entries, next)
    } else {
        (entries, String::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(entries: &[&'static str]) -> Vec<&'static str> {
        entries.to_vec()
    }

    #[test]
    fn pages_continue_after_the_token_even_when_it_was_deleted() {
        let all = ids(&["v1/m/p/d", "v1/m/p/a", "v1/m/p/c", "v1/m/p/b"]);
        let (first, token) = page(all.clone(), |e| e, "", 2);
        assert_eq!(first, ["v1/m/p/a", "v1/m/p/b"]);
        assert_eq!(token, "v1/m/p/b");
        // b (the token) and c deleted, e added before the next page
        let now = ids(&["v1/m/p/a", "v1/m/p/d", "v1/m/p/e"]);
        let (second, token) = page(now, |e| e, &token, 2);
        assert_eq!(second, ["v1/m/p/d", "v1/m/p/e"]);
        assert_eq!(token, "", "last page");
        let (whole, token) = page(all, |e| e, "", 0);
        assert_eq!(whole.len(), 4);
        assert!(token.is_empty());
        assert!(max_entries(-1).is_err());
        assert_eq!(max_entries(3).unwrap(), 3);
    }
}
