//! Config sections as the modules that own them declare them: a compact `Deserialize`
//! ([`config_section!`]) and the hook a section's owner gives the live reload ([`Prepare`]).
//!
//! A leaf, so every module can declare its section without importing `config`, which composes
//! them. The `Deserialize` reads one key lookup and one assignment per field:
//!
//! `#[derive(Deserialize)]` on a section with `#[serde(default, deny_unknown_fields)]` writes, per
//! struct, a field-name visitor, an `Option` slot and a duplicate check for every field, and a
//! final merge with `Default`; in the router build that was ~75 KB of code for the seven gateway
//! sections (docs/decisions/footprint.md, fourth round). [`config_section!`] reads the same TOML
//! with the same errors (an unknown key names itself, the expected keys and its line; a bad value
//! names its line and the expected type) from code shared by every section: each section adds a
//! field list and a `match` that deserializes one field. TOML itself refuses a key given twice, so
//! no duplicate check is needed.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{DeserializeSeed, Deserializer, Error, MapAccess, Visitor};

/// Applies a prepared change; runs only after every part of a reload prepared successfully.
pub type Commit = Box<dyn FnOnce() + Send>;

/// Prepares one part's new state from its section `S` of a validated config (the composition
/// root hands each part its own section).
pub type Prepare<S> = Box<dyn Fn(&S) -> anyhow::Result<Commit> + Send + Sync>;

/// A config section read by [`config_section!`]: starts from `Default`, then every key present
/// in the table overwrites its field.
pub trait Section: Default {
    /// The struct's name, as serde's derive names it in "expected struct ..." errors.
    const NAME: &'static str;
    /// Every key the section accepts, which is every field of the struct.
    const FIELDS: &'static [&'static str];
    /// Deserializes `value` into the field named `key` (one of [`Section::FIELDS`]).
    fn read<'de, D: Deserializer<'de>>(
        &mut self,
        key: &'static str,
        value: D,
    ) -> Result<(), D::Error>;
}

/// Reads a section from a TOML table.
pub fn deserialize<'de, S: Section, D: Deserializer<'de>>(d: D) -> Result<S, D::Error> {
    d.deserialize_struct(S::NAME, S::FIELDS, SectionVisitor(PhantomData))
}

struct SectionVisitor<S>(PhantomData<S>);

impl<'de, S: Section> Visitor<'de> for SectionVisitor<S> {
    type Value = S;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "struct {}", S::NAME)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<S, A::Error> {
        let mut section = S::default();
        while let Some(key) = map.next_key_seed(Key(S::FIELDS))? {
            map.next_value_seed(Field {
                section: &mut section,
                key,
            })?;
        }
        Ok(section)
    }
}

/// A key, checked against the section's fields while it is read, so that an unknown key's error
/// carries the key's own location.
struct Key(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for Key {
    type Value = &'static str;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for Key {
    type Value = &'static str;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: Error>(self, v: &str) -> Result<Self::Value, E> {
        self.0
            .iter()
            .find(|field| **field == v)
            .copied()
            .ok_or_else(|| E::unknown_field(v, self.0))
    }
}

/// The value of one key, deserialized straight into its field.
struct Field<'a, S> {
    section: &'a mut S,
    key: &'static str,
}

impl<'de, S: Section> DeserializeSeed<'de> for Field<'_, S> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.section.read(self.key, d)
    }
}

/// `config_section!(Type { field, ... })`: implements [`Section`] and `Deserialize` for a config
/// struct whose every field is listed (a field left out of the list does not compile).
macro_rules! config_section {
    ($ty:ident { $($field:ident),+ $(,)? }) => {
        impl $crate::section::Section for $ty {
            const NAME: &'static str = stringify!($ty);
            const FIELDS: &'static [&'static str] = &[$(stringify!($field)),+];

            fn read<'de, D: serde::Deserializer<'de>>(
                &mut self,
                key: &'static str,
                value: D,
            ) -> Result<(), D::Error> {
                match key {
                    $(stringify!($field) => self.$field = serde::Deserialize::deserialize(value)?,)+
                    _ => {
                        return Err(<D::Error as serde::de::Error>::unknown_field(
                            key,
                            <Self as $crate::section::Section>::FIELDS,
                        ))
                    }
                }
                Ok(())
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                // Every field is in the list: this pattern does not compile otherwise.
                #[allow(dead_code)]
                fn every_field_is_listed(section: &$ty) {
                    let $ty { $($field: _),+ } = section;
                }
                $crate::section::deserialize(d)
            }
        }
    };
}

pub(crate) use config_section;
