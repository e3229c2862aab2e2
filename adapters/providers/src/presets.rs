//! Connectors that ship with opledger, embedded in the binary.
//!
//! For now the three shapes of the CRM stand (the wire contract is in [`crate::contract`]); each
//! is an ordinary connector document and runs through exactly the code path a user's file does.
//! A preset leaves out what belongs to an installation (base URL, accounts), which the user gives
//! as [`crate::Overrides`].

/// Every preset: its name, its file name and its text.
const PRESETS: &[(&str, &str, &str)] = &[
    (
        "crm-stand-keyed",
        "crm-stand-keyed.toml",
        include_str!("../connectors/crm-stand-keyed.toml"),
    ),
    (
        "crm-stand-labelled",
        "crm-stand-labelled.toml",
        include_str!("../connectors/crm-stand-labelled.toml"),
    ),
    (
        "crm-stand-plain",
        "crm-stand-plain.toml",
        include_str!("../connectors/crm-stand-plain.toml"),
    ),
];

/// The preset called `name`: its file name and its text.
pub fn preset(name: &str) -> Option<(&'static str, &'static str)> {
    PRESETS
        .iter()
        .find(|(preset, _, _)| *preset == name)
        .map(|(_, file, text)| (*file, *text))
}

/// The names of every preset, in a fixed order.
pub fn preset_names() -> impl Iterator<Item = &'static str> {
    PRESETS.iter().map(|(name, _, _)| *name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::{parse, Dedup, Lookup};

    #[test]
    fn every_preset_loads_and_is_named_by_its_file() {
        for name in preset_names() {
            let (file, text) = preset(name).expect("listed");
            assert_eq!(file, format!("{name}.toml"));
            let document = parse(file, text).unwrap_or_else(|errors| {
                panic!("{}", crate::error::render_all(&errors));
            });
            assert_eq!(document.id.as_str(), name);
            assert!(
                document.base_url.is_none(),
                "the stand's address belongs to the installation"
            );
            assert!(document.action("create_task").is_some());
        }
        assert_eq!(preset("hubspot"), None);
    }

    #[test]
    fn the_stand_presets_carry_the_stands_contracts() {
        let load = |name: &str| {
            let (file, text) = preset(name).expect("a preset");
            parse(file, text).expect("valid")
        };
        let keyed = load("crm-stand-keyed");
        assert!(matches!(
            keyed.actions[0].dedup,
            Dedup::IdempotencyKey {
                retention_s: 86_400,
                safety_margin_s: 3_600,
                ..
            }
        ));
        assert!(matches!(keyed.actions[0].lookup, Lookup::Consistent(_)));
        let labelled = load("crm-stand-labelled");
        assert!(matches!(
            labelled.actions[0].dedup,
            Dedup::UniqueLabel { conflict: Some(_) }
        ));
        let plain = load("crm-stand-plain");
        assert!(matches!(plain.actions[0].dedup, Dedup::None));
        assert!(
            matches!(&plain.actions[0].lookup, Lookup::Search(search) if search.lag_ms == 2_000)
        );
    }
}
