//! Tests for the pure balancing algorithms, including the consistent-hashing property that adding
//! one server moves about 1/n of the keys.

use super::*;
use proptest::prelude::*;

#[test]
fn swrr_matches_nginx_order() {
    // nginx's documented example: weights 5, 1, 1 give a a b a c a a.
    assert_eq!(
        smooth_weighted_sequence(&[5, 1, 1]),
        vec![0, 0, 1, 0, 2, 0, 0]
    );
    assert_eq!(smooth_weighted_sequence(&[1, 1, 1]), vec![0, 1, 2]);
    // Common factors are removed: 4,2 cycles like 2,1.
    assert_eq!(smooth_weighted_sequence(&[4, 2]), vec![0, 1, 0]);
}

#[test]
fn swrr_shares_are_exact() {
    let seq = smooth_weighted_sequence(&[3, 7, 1, 9]);
    assert_eq!(seq.len(), 20);
    for (i, w) in [3, 7, 1, 9].into_iter().enumerate() {
        assert_eq!(seq.iter().filter(|&&s| s == i).count(), w);
    }
}

#[test]
fn ring_shares_follow_weights() {
    let m = HashRing::new(&["a:1", "b:1", "c:1"], &[1, 1, 2]);
    let mut counts = [0usize; 3];
    for k in 0..40_000u32 {
        counts[m.pick(m.slot(&k.to_be_bytes()), |_| true).unwrap()] += 1;
    }
    let total = 40_000f64;
    assert!((counts[0] as f64 / total - 0.25).abs() < 0.05, "{counts:?}");
    assert!((counts[2] as f64 / total - 0.5).abs() < 0.05, "{counts:?}");
}

#[test]
fn ring_skips_unusable_and_spreads_its_keys() {
    let names = ["a:1", "b:1", "c:1", "d:1"];
    let m = HashRing::new(&names, &[1; 4]);
    let mut moved_to = [0usize; 4];
    for k in 0..4000u32 {
        let slot = m.slot(&k.to_be_bytes());
        if m.pick(slot, |_| true) == Some(0) {
            let now = m.pick(slot, |s| s != 0).unwrap();
            moved_to[now] += 1;
        }
    }
    assert_eq!(moved_to[0], 0);
    // Server 0's keys go to all three others, not to one neighbour.
    assert!(moved_to[1..].iter().all(|&c| c > 100), "{moved_to:?}");
    assert_eq!(m.pick(0, |_| false), None);
}

#[test]
fn least_loaded_by_weight() {
    let mut c = vec![(0, 4, 1), (1, 5, 2), (2, 0, 1), (3, 2, 1)];
    order_by_load(&mut c);
    let ids: Vec<usize> = c.iter().map(|x| x.0).collect();
    assert_eq!(ids, vec![2, 3, 1, 0]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn adding_a_server_moves_about_one_nth(n in 2usize..12, seed in any::<u32>()) {
        let names: Vec<String> = (0..=n).map(|i| format!("10.0.{}.{}:80", seed % 200, i)).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let before = HashRing::new(&refs[..n], &vec![1; n]);
        let after = HashRing::new(&refs, &vec![1; n + 1]);
        let keys = 20_000u32;
        let mut moved = 0;
        let mut moved_elsewhere = 0;
        for k in 0..keys {
            let key = (k ^ seed.rotate_left(7)).to_be_bytes();
            let a = before.pick(before.slot(&key), |_| true).unwrap();
            let b = after.pick(after.slot(&key), |_| true).unwrap();
            if a != b {
                moved += 1;
                if b != n {
                    moved_elsewhere += 1;
                }
            }
        }
        let frac = f64::from(moved) / f64::from(keys);
        let ideal = 1.0 / (n as f64 + 1.0);
        prop_assert!(frac > ideal * 0.7 && frac < ideal * 1.6, "n={} moved {} ideal {}", n, frac, ideal);
        // Every moved key went to the new server: nothing reshuffles between the old ones.
        prop_assert_eq!(moved_elsewhere, 0);
    }
}
