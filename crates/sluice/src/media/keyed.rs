//! Keyed single flight: one async lock per key, held while one fetch of that key runs.
//!
//! Concurrent misses of one key take turns (the first fetches, the rest find what it kept), and
//! the key leaves the map with its last holder, however each holder ends, so the map holds only
//! keys being worked on (`/proxy/epg` guides, extractor pages).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};

/// A key's lock and the number of holders (running or waiting) it has.
type Slot = (Arc<tokio::sync::Mutex<()>>, usize);

/// The keys being worked on, each with its lock.
pub struct Keyed<K> {
    map: Mutex<HashMap<K, Slot>>,
}

/// One holder of a key: made by [`Keyed::hold`], waits for its turn with [`Holder::turn`].
/// Dropped however its request ends (finished, failed, or cancelled while waiting); the last
/// holder of a key takes the key out of the map.
pub struct Holder<'a, K: Eq + Hash> {
    keyed: &'a Keyed<K>,
    key: K,
    gate: Arc<tokio::sync::Mutex<()>>,
}

impl<K: Eq + Hash + Clone> Keyed<K> {
    pub fn new() -> Self {
        Keyed {
            map: Mutex::new(HashMap::new()),
        }
    }

    /// Joins `key`'s holders, making its lock if it has none.
    pub fn hold(&self, key: K) -> Holder<'_, K> {
        let mut map = self.lock();
        let (gate, holders) = map.entry(key.clone()).or_default();
        *holders += 1;
        Holder {
            keyed: self,
            gate: gate.clone(),
            key,
        }
    }

    /// Keys held now.
    #[cfg(test)]
    pub fn keys_held(&self) -> usize {
        self.lock().len()
    }

    /// The map; nothing panics while holding it, but a poisoned map is still a sound one.
    fn lock(&self) -> MutexGuard<'_, HashMap<K, Slot>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<K: Eq + Hash + Clone> Default for Keyed<K> {
    fn default() -> Self {
        Keyed::new()
    }
}

impl<K: Eq + Hash> Holder<'_, K> {
    /// Waits until no other holder of the key has its turn; the turn lasts until the guard drops.
    pub async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.gate.lock().await
    }
}

impl<K: Eq + Hash> Drop for Holder<'_, K> {
    fn drop(&mut self) {
        let mut map = self.keyed.map.lock().unwrap_or_else(|e| e.into_inner());
        // Holders are counted under the map's lock, so the entry cannot be replaced while this
        // one lives; the check keeps a newer entry for the key safe all the same.
        let last = match map.get_mut(&self.key) {
            Some((gate, holders)) if Arc::ptr_eq(gate, &self.gate) => {
                *holders -= 1;
                *holders == 0
            }
            _ => false,
        };
        if last {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;
    use std::time::Duration;

    #[test]
    fn two_holders_of_a_key_take_turns() {
        let keyed = Keyed::new();
        let (a, b) = (keyed.hold(1), keyed.hold(1));
        assert_eq!(keyed.keys_held(), 1);
        let turn = a.turn().now_or_never().expect("a's turn at once");
        assert!(b.turn().now_or_never().is_none(), "b waits for a");
        drop(turn);
        assert!(b.turn().now_or_never().is_some(), "b's turn once a's ends");
    }

    /// The entry stays while anyone holds it and leaves with its last holder, whichever that is
    /// (the fetch's leader, or a waiter that found the result kept meanwhile).
    #[test]
    fn the_entry_leaves_with_its_last_holder() {
        let keyed = Keyed::new();
        let (leader, waiter) = (keyed.hold([7u8; 32]), keyed.hold([7u8; 32]));
        drop(leader);
        assert_eq!(keyed.keys_held(), 1);
        let late = keyed.hold([7u8; 32]);
        drop(waiter);
        assert_eq!(keyed.keys_held(), 1);
        drop(late);
        assert_eq!(keyed.keys_held(), 0);
        // A key held again later gets a fresh entry, and leaves as well.
        let again = keyed.hold([7u8; 32]);
        assert_eq!(keyed.keys_held(), 1);
        drop(again);
        assert_eq!(keyed.keys_held(), 0);
    }

    #[test]
    fn different_keys_are_independent() {
        let keyed = Keyed::new();
        let (a, b) = (keyed.hold("a"), keyed.hold("b"));
        assert_eq!(keyed.keys_held(), 2);
        let _a_turn = a.turn().now_or_never().expect("a's turn");
        assert!(b.turn().now_or_never().is_some(), "b does not wait for a");
        drop(b);
        assert_eq!(keyed.keys_held(), 1);
    }

    /// A holder whose task is cancelled, while waiting or during its turn, lets go of both its
    /// turn and its place.
    #[tokio::test]
    async fn a_cancelled_holder_releases() {
        let keyed = Arc::new(Keyed::new());
        let spawn = |keyed: Arc<Keyed<u8>>| {
            tokio::spawn(async move {
                let holder = keyed.hold(1);
                let _turn = holder.turn().await;
                tokio::time::sleep(Duration::from_secs(3600)).await;
            })
        };
        let first = spawn(keyed.clone());
        tokio::time::sleep(Duration::from_millis(50)).await;
        let second = spawn(keyed.clone());
        tokio::time::sleep(Duration::from_millis(50)).await;
        let third = keyed.hold(1);
        assert!(third.turn().now_or_never().is_none(), "first has the turn");
        second.abort();
        assert!(second.await.unwrap_err().is_cancelled());
        assert_eq!(keyed.keys_held(), 1);
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        assert!(third.turn().now_or_never().is_some(), "first's turn ended");
        assert_eq!(keyed.keys_held(), 1);
        drop(third);
        assert_eq!(keyed.keys_held(), 0);
    }
}
