//! RBD image feature bits, parsed from the names users write in StorageClasses.

use std::fmt;

use crate::Error;

/// A set of RBD image features (the `RBD_FEATURE_*` bits of librbd).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Features(u64);

impl Features {
    pub const LAYERING: Features = Features(1 << 0);
    pub const STRIPINGV2: Features = Features(1 << 1);
    pub const EXCLUSIVE_LOCK: Features = Features(1 << 2);
    pub const OBJECT_MAP: Features = Features(1 << 3);
    pub const FAST_DIFF: Features = Features(1 << 4);
    pub const DEEP_FLATTEN: Features = Features(1 << 5);
    pub const JOURNALING: Features = Features(1 << 6);
    pub const DATA_POOL: Features = Features(1 << 7);
    pub const OPERATIONS: Features = Features(1 << 8);
    pub const MIGRATING: Features = Features(1 << 9);
    pub const NON_PRIMARY: Features = Features(1 << 10);

    /// The names users may request, in librbd's order.
    const NAMED: [(&'static str, Features); 6] = [
        ("layering", Features::LAYERING),
        ("exclusive-lock", Features::EXCLUSIVE_LOCK),
        ("object-map", Features::OBJECT_MAP),
        ("fast-diff", Features::FAST_DIFF),
        ("deep-flatten", Features::DEEP_FLATTEN),
        ("journaling", Features::JOURNALING),
    ];

    /// No features.
    pub const fn empty() -> Features {
        Features(0)
    }

    /// The raw bit mask.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// From a raw bit mask (as librbd reports it).
    pub const fn from_bits(bits: u64) -> Features {
        Features(bits)
    }

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: Features) -> bool {
        self.0 & other.0 == other.0
    }

    /// Parses a comma-separated list such as `layering,exclusive-lock,object-map`.
    ///
    /// Names are case-insensitive and may be surrounded by spaces; an empty string is the empty
    /// set. The dependency rules of librbd are enforced here, so a bad class fails with a clear
    /// message instead of an `EINVAL` from Ceph: object-map needs exclusive-lock, fast-diff
    /// needs object-map, journaling needs exclusive-lock.
    pub fn parse(list: &str) -> Result<Features, Error> {
        let mut set = Features::empty();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let Some((_, bit)) = Features::NAMED
                .iter()
                .find(|(known, _)| known.eq_ignore_ascii_case(name))
            else {
                let known: Vec<&str> = Features::NAMED.iter().map(|(n, _)| *n).collect();
                return Err(Error::invalid(
                    "parse image features",
                    list,
                    format!("unknown feature {name:?}; supported: {}", known.join(", ")),
                ));
            };
            set = set | *bit;
        }
        set.validate().map(|()| set)
    }

    /// Checks librbd's dependency rules.
    pub fn validate(self) -> Result<(), Error> {
        let rules = [
            (
                Features::OBJECT_MAP,
                Features::EXCLUSIVE_LOCK,
                "object-map requires exclusive-lock",
            ),
            (
                Features::FAST_DIFF,
                Features::OBJECT_MAP,
                "fast-diff requires object-map",
            ),
            (
                Features::JOURNALING,
                Features::EXCLUSIVE_LOCK,
                "journaling requires exclusive-lock",
            ),
        ];
        for (feature, needs, why) in rules {
            if self.contains(feature) && !self.contains(needs) {
                return Err(Error::invalid(
                    "validate image features",
                    self.to_string(),
                    why,
                ));
            }
        }
        Ok(())
    }
}

impl std::ops::BitOr for Features {
    type Output = Features;
    fn bitor(self, rhs: Features) -> Features {
        Features(self.0 | rhs.0)
    }
}

impl fmt::Display for Features {
    /// Comma-separated names of the known bits, in librbd's order.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let all = [
            ("layering", Features::LAYERING),
            ("striping", Features::STRIPINGV2),
            ("exclusive-lock", Features::EXCLUSIVE_LOCK),
            ("object-map", Features::OBJECT_MAP),
            ("fast-diff", Features::FAST_DIFF),
            ("deep-flatten", Features::DEEP_FLATTEN),
            ("journaling", Features::JOURNALING),
            ("data-pool", Features::DATA_POOL),
            ("operations", Features::OPERATIONS),
            ("migrating", Features::MIGRATING),
            ("non-primary", Features::NON_PRIMARY),
        ];
        let names: Vec<&str> = all
            .iter()
            .filter(|(_, bit)| self.contains(*bit))
            .map(|(n, _)| *n)
            .collect();
        f.write_str(&names.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_case_insensitively_and_prints_them_back() {
        let f = Features::parse(" Layering, exclusive-lock ,object-map,fast-diff").unwrap();
        assert_eq!(f.bits(), 1 | 4 | 8 | 16);
        assert_eq!(
            f.to_string(),
            "layering,exclusive-lock,object-map,fast-diff"
        );
        assert_eq!(Features::parse("").unwrap(), Features::empty());
    }

    #[test]
    fn enforces_dependencies() {
        let e = Features::parse("layering,object-map").unwrap_err();
        assert!(
            e.to_string().contains("object-map requires exclusive-lock"),
            "{e}"
        );
        let e = Features::parse("exclusive-lock,fast-diff").unwrap_err();
        assert!(
            e.to_string().contains("fast-diff requires object-map"),
            "{e}"
        );
        let e = Features::parse("journaling").unwrap_err();
        assert!(
            e.to_string().contains("journaling requires exclusive-lock"),
            "{e}"
        );
        assert!(Features::parse("exclusive-lock,journaling").is_ok());
    }

    #[test]
    fn rejects_unknown_names_and_lists_the_known_ones() {
        let e = Features::parse("layering,striping-v3").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("\"striping-v3\""), "{text}");
        assert!(text.contains("deep-flatten"), "{text}");
    }
}
