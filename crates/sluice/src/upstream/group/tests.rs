//! Tests of group planning: weighted distribution, least connections, hashing, backups, passive
//! ejection with one trial, state carried over a rebuild.

use super::*;

fn group(toml_text: &str) -> Group {
    let config: GroupConfig = toml::from_str(toml_text).unwrap();
    Group::new(&config).unwrap()
}

fn firsts(g: &Group, n: usize) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for _ in 0..n {
        let plan = g.plan(None);
        *counts.entry(plan[0].addr().to_string()).or_default() += 1;
    }
    counts
}

#[test]
fn weighted_round_robin_shares() {
    let g = group(
        r#"name = "app"
        servers = [{ addr = "a:1", weight = 3 }, "b:1", { addr = "c:1", weight = 2 }]"#,
    );
    let c = firsts(&g, 600);
    assert_eq!((c["a:1"], c["b:1"], c["c:1"]), (300, 100, 200));
    // Every plan lists every usable primary exactly once.
    let plan = g.plan(None);
    let mut addrs: Vec<&str> = plan.iter().map(|s| s.addr()).collect();
    addrs.sort();
    assert_eq!(addrs, ["a:1", "b:1", "c:1"]);
}

#[test]
fn least_conn_prefers_idle_servers() {
    let g = group(
        r#"name = "db"
        balance = "least_conn"
        servers = ["a:1", "b:1", "c:1"]"#,
    );
    let a = g.servers()[0].begin();
    let _a2 = g.servers()[0].begin();
    let _b = g.servers()[1].begin();
    for _ in 0..5 {
        assert_eq!(g.plan(None)[0].addr(), "c:1");
    }
    drop(a);
    let _c = g.servers()[2].begin();
    let _c2 = g.servers()[2].begin();
    // a:1 1, b:1 1, c:1 2 → a or b lead, c is last.
    let plan = g.plan(None);
    assert_eq!(plan[2].addr(), "c:1");
}

#[test]
fn hash_is_sticky_and_fails_over() {
    let g = group(
        r#"name = "h"
        balance = "hash"
        hash_key = "client_ip"
        servers = ["a:1", "b:1", "c:1"]"#,
    );
    let first = g.plan(Some(b"10.1.2.3"))[0].addr().to_string();
    for _ in 0..10 {
        assert_eq!(g.plan(Some(b"10.1.2.3"))[0].addr(), first);
    }
    let owner = g.servers().iter().find(|s| s.addr() == first).unwrap();
    owner.set_healthy(false);
    let other = g.plan(Some(b"10.1.2.3"))[0].addr().to_string();
    assert_ne!(other, first);
    assert_eq!(g.plan(Some(b"10.1.2.3")).len(), 2);
    owner.set_healthy(true);
    assert_eq!(g.plan(Some(b"10.1.2.3"))[0].addr(), first);
}

#[test]
fn backups_only_when_all_primaries_are_down() {
    let g = group(
        r#"name = "b"
        servers = ["a:1", "b:1", { addr = "z:1", backup = true }]"#,
    );
    for _ in 0..4 {
        assert!(g.plan(None).iter().all(|s| !s.is_backup()));
    }
    g.servers()[0].set_healthy(false);
    assert_eq!(g.plan(None).len(), 1);
    g.servers()[1].set_healthy(false);
    let plan = g.plan(None);
    assert_eq!(plan.len(), 1);
    assert_eq!(plan[0].addr(), "z:1");
    g.servers()[2].set_healthy(false);
    assert!(g.plan(None).is_empty());
    g.servers()[1].set_healthy(true);
    assert_eq!(g.plan(None)[0].addr(), "b:1");
}

#[test]
fn passive_ejection_then_one_trial() {
    let g = group(
        r#"name = "p"
        max_fails = 2
        fail_timeout_secs = 1
        servers = ["a:1", "b:1"]"#,
    );
    let a = Arc::clone(&g.servers()[0]);
    a.report_failure();
    assert!(a.is_usable());
    a.report_failure();
    assert!(!a.is_usable());
    assert_eq!(a.ejections(), 1);
    for _ in 0..4 {
        assert_eq!(
            g.plan(None).iter().map(|s| s.addr()).collect::<Vec<_>>(),
            ["b:1"]
        );
    }
    std::thread::sleep(Duration::from_millis(1100));
    // Exactly one plan gets the trial, with a:1 first; the next one does not see it.
    let trial = g.plan(None);
    assert_eq!(trial[0].addr(), "a:1");
    assert_eq!(g.plan(None).len(), 1);
    // The trial fails: out again, without counting a new ejection.
    a.report_failure();
    assert!(!a.is_usable());
    assert_eq!(a.ejections(), 1);
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(g.plan(None)[0].addr(), "a:1");
    a.report_success();
    assert!(a.is_usable());
    assert_eq!(a.failures(), 0);
    assert_eq!(g.plan(None).len(), 2);
}

/// Finding: passive ejection could empty a group: failures a client provokes (heads an origin
/// drops without answering, replayed on the next server) ejected every server, and every request
/// got 503 for `fail_timeout_secs`. With nothing usable, the plan now holds the primaries the
/// active check calls up (all of them without a check), ejected or not; backups still come
/// first while any is usable, and a primary the check took out stays out.
#[test]
fn passive_ejection_alone_never_empties_the_plan() {
    let g = group(
        r#"name = "p"
        max_fails = 1
        fail_timeout_secs = 60
        servers = ["a:1", "b:1", { addr = "z:1", backup = true }]"#,
    );
    let addrs = |plan: Plan<'_>| {
        let mut v: Vec<String> = plan.iter().map(|s| s.addr().to_string()).collect();
        v.sort();
        v
    };
    let (a, b, z) = (&g.servers()[0], &g.servers()[1], &g.servers()[2]);
    a.report_failure();
    b.report_failure();
    assert!(a.is_ejected() && b.is_ejected());
    // A usable backup goes before ejected primaries.
    assert_eq!(addrs(g.plan(None)), ["z:1"]);
    z.report_failure();
    assert!(z.is_ejected());
    // Everything ejected: a primary, still up by the (absent) check, is tried (one a plan).
    for _ in 0..3 {
        let plan = addrs(g.plan(None));
        assert!(plan == ["a:1"] || plan == ["b:1"], "{plan:?}");
    }
    // A primary the active check calls down is not.
    a.set_healthy(false);
    assert_eq!(addrs(g.plan(None)), ["b:1"]);
    // No primary up by the check: the backup it calls up, ejected as it is.
    b.set_healthy(false);
    assert_eq!(addrs(g.plan(None)), ["z:1"]);
    // Nothing up by the check: empty (503).
    z.set_healthy(false);
    assert!(g.plan(None).is_empty());
    // Up again by the check: the fallback holds it, ejected as it is, and a success on it ends
    // the ejection.
    b.set_healthy(true);
    b.report_failure();
    assert!(b.is_ejected());
    assert_eq!(addrs(g.plan(None)), ["b:1"]);
    b.report_success();
    assert!(b.is_usable());
}

/// Finding (review of the fallback): with every primary down by the active check and every
/// backup ejected by passive failures, the fallback (primaries only) found nothing: 503 for
/// everyone, passive ejection alone having emptied the group. It turns to the backups the
/// check calls up when no primary is.
#[test]
fn the_fallback_turns_to_backups_when_the_check_takes_every_primary() {
    let g = group(
        r#"name = "p"
        max_fails = 1
        fail_timeout_secs = 60
        servers = ["a:1", { addr = "y:1", backup = true }, { addr = "z:1", backup = true }]"#,
    );
    let (a, y, z) = (&g.servers()[0], &g.servers()[1], &g.servers()[2]);
    a.set_healthy(false);
    y.report_failure();
    z.report_failure();
    assert!(y.is_ejected() && z.is_ejected());
    let mut seen = Vec::new();
    for _ in 0..2 {
        let plan = g.plan(None);
        assert_eq!(plan.len(), 1);
        assert!(plan[0].is_backup());
        seen.push(plan[0].addr().to_string());
    }
    seen.sort();
    assert_eq!(seen, ["y:1", "z:1"]);
    // A backup the check calls down is not tried.
    y.set_healthy(false);
    z.set_healthy(false);
    assert!(g.plan(None).is_empty());
}

/// Finding (review of the fallback): it planned every primary, so with every server truly dead
/// and no active check each request cost a connect timeout per server (a `[[tcp]]` connection
/// dialled them all), and each failure pushed the ejection deadline back, so the one recovery
/// trial never came while traffic flowed. A fallback plan holds the balanced choice alone, its
/// failure leaves the deadline where it was, and the trial still comes (and its failure starts
/// the timeout over). Each plan is counted.
#[test]
fn a_fallback_plan_holds_one_server_and_leaves_its_deadline() {
    let g = group(
        r#"name = "p"
        max_fails = 1
        fail_timeout_secs = 60
        servers = ["a:1", "b:1", "c:1"]"#,
    );
    for s in g.servers() {
        s.report_failure();
        assert!(s.is_ejected());
    }
    // Ejected 30 s ago (of 60): 30 s left.
    let until = clock_ms() + 30_000;
    for s in g.servers() {
        s.ejected_until.store(until, SeqCst);
    }
    assert_eq!(g.fallback_plans(), 0);
    for k in 1..=6 {
        let plan = g.plan(None);
        assert_eq!(plan.len(), 1, "a fallback plan holds one server");
        assert!(plan.trial.is_none());
        plan[0].report_failure();
        drop(plan);
        assert_eq!(g.fallback_plans(), k);
        for s in g.servers() {
            assert_eq!(s.ejected_until.load(SeqCst), until, "{}", s.addr());
            assert_eq!(s.ejections(), 1);
        }
    }
    // The deadline runs out: the next plan takes a's trial, as a normal plan (not counted).
    let a = &g.servers()[0];
    a.ejected_until.store(1, SeqCst);
    let trial = g.plan(None);
    assert_eq!((trial.len(), trial[0].addr()), (1, "a:1"));
    assert!(trial.trial.is_some());
    assert_eq!(g.fallback_plans(), 6);
    // Its failure is the trial's verdict: a full `fail_timeout` from now.
    let before = clock_ms();
    a.report_failure();
    drop(trial);
    assert!(a.ejected_until.load(SeqCst) >= before + 60_000);
    assert!(a.is_ejected());
    assert_eq!(a.ejections(), 1);
}

/// Finding (review of the fallback): the backup branch moved the round robin even with no
/// backup to turn, and the fallback moved it again: two steps a plan, so with an even cycle the
/// fallback led with the same server every time. Two equal primaries, both ejected: two plans
/// try both.
#[test]
fn the_fallback_rotation_covers_every_server() {
    let g = group(
        r#"name = "p"
        max_fails = 1
        fail_timeout_secs = 60
        servers = ["a:1", "b:1"]"#,
    );
    for s in g.servers() {
        s.report_failure();
    }
    for _ in 0..3 {
        let mut seen: Vec<String> = (0..2).map(|_| g.plan(None)[0].addr().to_string()).collect();
        seen.sort();
        assert_eq!(seen, ["a:1", "b:1"]);
    }
}

/// Finding: a plan that took an ejected server's one recovery trial moved its deadline a full
/// `fail_timeout` on; when the request ended with no verdict (cancelled, its client's body
/// failed, never sent), nothing was reported and the server stayed out another period, so a
/// client could keep it out by abandoning requests. The trial now goes back when the plan ends
/// without a verdict; a verdict reported before the plan ends stands.
#[test]
fn a_trial_ended_without_a_verdict_is_given_back() {
    let g = group(
        r#"name = "p"
        max_fails = 1
        fail_timeout_secs = 60
        servers = ["a:1", "b:1"]"#,
    );
    let a = Arc::clone(&g.servers()[0]);
    let addrs = |plan: Plan<'_>| {
        plan.iter()
            .map(|s| s.addr().to_string())
            .collect::<Vec<_>>()
    };
    // The fail timeout has run out (as if 60 s had passed since the ejection).
    let expire = || a.ejected_until.store(1, Ordering::Relaxed);
    a.report_failure();
    assert!(a.is_ejected());
    expire();
    let trial = g.plan(None);
    assert_eq!(trial[0].addr(), "a:1");
    // While the trial is out, no other plan has the server.
    assert_eq!(addrs(g.plan(None)), ["b:1"]);
    drop(trial);
    // Dropped without a verdict: the very next plan has the trial, and only that one.
    let trial = g.plan(None);
    assert_eq!(trial[0].addr(), "a:1");
    assert_eq!(addrs(g.plan(None)), ["b:1"]);
    // Taken through the by-value iterator (as the TCP listener does) and dropped: back again.
    drop(trial);
    let mut iter = g.plan(None).into_iter();
    assert_eq!(iter.next().unwrap().addr(), "a:1");
    drop(iter);
    // A failed trial stands when its plan ends: out for the full period, no new ejection.
    let trial = g.plan(None);
    assert_eq!(trial[0].addr(), "a:1");
    a.report_failure();
    drop(trial);
    assert!(a.is_ejected());
    assert_eq!(addrs(g.plan(None)), ["b:1"]);
    assert_eq!(a.ejections(), 1);
    // So does a successful one: back in service.
    expire();
    let trial = g.plan(None);
    assert_eq!(trial[0].addr(), "a:1");
    a.report_success();
    drop(trial);
    assert!(a.is_usable());
    assert_eq!(g.plan(None).len(), 2);
}

/// A group of `a:1` and `b:1` (`max_fails = 1`) whose `a:1` was ejected and whose fail timeout
/// has run out (as if 60 s had passed): the next plan takes its trial.
fn ejected_and_expired() -> (Group, Arc<Server>) {
    let g = group(
        r#"name = "p"
        max_fails = 1
        fail_timeout_secs = 60
        servers = ["a:1", "b:1"]"#,
    );
    let a = Arc::clone(&g.servers()[0]);
    a.report_failure();
    a.ejected_until.store(1, Ordering::Relaxed);
    (g, a)
}

/// Finding: a plan whose upload failed while the body was stalled on its client booked nothing
/// and gave the trial back on drop, so upload after upload took an ejected server's trial (each
/// a 502) instead of one per `fail_timeout`. A spent trial now stays spent: out until the
/// deadline it set, with no ejection counted; a plan not holding the trial spends nothing.
#[test]
fn a_spent_trial_is_not_given_back() {
    let (g, a) = ejected_and_expired();
    let trial = g.plan(None);
    assert_eq!(trial[0].addr(), "a:1");
    // Another plan (without the trial) spends nothing of it.
    let other = g.plan(None);
    other.spend_trial(0);
    drop(other);
    trial.spend_trial(0);
    drop(trial);
    assert!(a.is_ejected());
    assert_eq!(g.plan(None).len(), 1);
    assert_eq!((a.failures(), a.ejections()), (1, 1));
}

/// Finding (review of the trial): a recovery trial was told apart by its marker alone, so a
/// failure of another plan while it was out (the fallback's, sent to the server because nothing
/// else was usable) was taken for its verdict: the trial decided by an attempt that was not
/// its own. Reported through the plan that made the attempt, only the trial's own decides it.
#[test]
fn only_the_trials_own_attempt_decides_it() {
    let g = group(
        r#"name = "p"
        max_fails = 1
        fail_timeout_secs = 60
        servers = ["a:1", "b:1"]"#,
    );
    let (a, b) = (&g.servers()[0], &g.servers()[1]);
    a.report_failure();
    b.report_failure();
    // a's fail timeout has run out (as if 60 s had passed); b is still out.
    a.ejected_until.store(1, SeqCst);
    let trial = g.plan(None);
    assert!(trial.trial.is_some());
    assert_eq!((trial.len(), trial[0].addr()), (1, "a:1"));
    let next = a.ejected_until.load(SeqCst);
    // Nothing usable meanwhile: fallback plans, one a:1's (the rotation covers both).
    let plans: Vec<Plan<'_>> = (0..2).map(|_| g.plan(None)).collect();
    let fallback = plans.iter().find(|p| p[0].addr() == "a:1").unwrap();
    assert!(fallback.trial.is_none());
    let (index, _) = fallback.indexed().next().unwrap();
    fallback.report_failure(index);
    drop(plans);
    // Not the trial's verdict: its marker and deadline stand.
    assert_eq!(
        a.trial.load(SeqCst),
        next,
        "the fallback's failure decided the trial"
    );
    assert_eq!(a.ejected_until.load(SeqCst), next);
    // Dropped undecided, the trial is given back; the next plan's own failure decides it.
    drop(trial);
    let again = g.plan(None);
    assert!(again.trial.is_some());
    assert_eq!(again[0].addr(), "a:1");
    again.report_failure(index);
    drop(again);
    assert_eq!(a.trial.load(SeqCst), 0);
    assert!(a.is_ejected());
    assert!(g.plan(None).trial.is_none());
    assert_eq!(a.ejections(), 1);
}

/// Finding: a failure reported between a plan's taking the trial (its deadline moved) and its
/// marking it, ejecting to the same millisecond's deadline, was taken for the trial's and
/// undone by the give-back. The marker is now set before the deadline moves, and an ejection
/// clears it after its own: here the failure lands after the deadline moved (same value).
#[test]
fn a_failure_during_a_trial_is_not_undone_by_its_give_back() {
    let (g, a) = ejected_and_expired();
    let trial = g.plan(None);
    assert_eq!(trial[0].addr(), "a:1");
    let next = a.ejected_until.load(Ordering::Relaxed);
    assert_eq!(a.trial.load(Ordering::Relaxed), next);
    // An earlier request's failure ejects the server again, to the very same deadline.
    a.report_failure();
    a.ejected_until.store(next, Ordering::Relaxed);
    drop(trial);
    assert_eq!(a.ejected_until.load(Ordering::Relaxed), next);
    assert_eq!(g.plan(None).len(), 1);
}

/// Finding: a reload copied an ejected server's deadline but not its outstanding trial, whose
/// give-back (or verdict) reaches only the old server: the new one sat out the whole period
/// the trial had set. A trial out on the old server now leaves the new one's deadline run
/// out, so its first plan takes the trial; an ejection with no trial out carries over whole.
#[test]
fn a_reload_during_a_trial_lets_the_next_plan_take_it() {
    let configs: Vec<GroupConfig> = vec![toml::from_str(
        r#"name = "g"
        max_fails = 1
        fail_timeout_secs = 60
        servers = ["a:1", "b:1"]"#,
    )
    .unwrap()];
    let old = Groups::new(&configs).unwrap();
    let og = old.get("g").unwrap();
    let a = Arc::clone(&og.servers()[0]);
    a.report_failure();
    // Ejected, no trial out: the new server is ejected too.
    let new = Groups::rebuild(&configs, Some(&old)).unwrap();
    let ng = new.get("g").unwrap();
    assert!(ng.servers()[0].is_ejected());
    assert_eq!(ng.plan(None).len(), 1);
    // The trial out on the old server when the reload comes.
    a.ejected_until.store(1, Ordering::Relaxed);
    let trial = og.plan(None);
    assert_eq!(trial[0].addr(), "a:1");
    assert!(a.is_ejected());
    let new = Groups::rebuild(&configs, Some(&old)).unwrap();
    let ng = new.get("g").unwrap();
    assert_eq!(ng.servers()[0].failures(), 1);
    assert!(!ng.servers()[0].is_ejected());
    let first = ng.plan(None);
    assert_eq!(first[0].addr(), "a:1");
    // That plan holds the new server's one trial.
    let others: Vec<String> = ng.plan(None).iter().map(|s| s.addr().to_string()).collect();
    assert_eq!(others, ["b:1"]);
    drop(first);
    drop(trial);
}

#[test]
fn rebuild_keeps_state_of_unchanged_servers() {
    let configs: Vec<GroupConfig> = vec![toml::from_str(
        r#"name = "g"
        servers = ["a:1", "b:1"]
        health_check = { kind = "http", path = "/up" }"#,
    )
    .unwrap()];
    let old = Groups::new(&configs).unwrap();
    old.get("g").unwrap().servers()[0].set_healthy(false);
    // The same check at another pace: its verdict stands.
    let new_configs: Vec<GroupConfig> = vec![toml::from_str(
        r#"name = "g"
        servers = ["a:1", "c:1"]
        health_check = { kind = "http", path = "/up", interval_secs = 1, fall = 1 }"#,
    )
    .unwrap()];
    let new = Groups::rebuild(&new_configs, Some(&old)).unwrap();
    let g = new.get("g").unwrap();
    assert!(!g.servers()[0].is_healthy());
    assert!(g.servers()[1].is_healthy());
}

/// A server the active check took out comes back when a reload removes the check or changes
/// what it probes: no checker of the old probe is left to bring it back. Its passive record
/// (failures, ejection) still carries over.
#[test]
fn rebuild_drops_the_verdict_of_a_removed_or_changed_check() {
    let checked: Vec<GroupConfig> = vec![toml::from_str(
        r#"name = "g"
        max_fails = 5
        servers = ["a:1", "b:1"]
        health_check = { kind = "http", path = "/wrong" }"#,
    )
    .unwrap()];
    for (reloaded, why) in [
        (
            r#"name = "g"
            max_fails = 5
            servers = ["a:1", "b:1"]"#,
            "check removed",
        ),
        (
            r#"name = "g"
            max_fails = 5
            servers = ["a:1", "b:1"]
            health_check = { kind = "http", path = "/healthz" }"#,
            "path changed",
        ),
    ] {
        let old = Groups::new(&checked).unwrap();
        let a = &old.get("g").unwrap().servers()[0];
        a.set_healthy(false);
        a.report_failure();
        assert_eq!(old.get("g").unwrap().plan(None).len(), 1);
        let new_configs: Vec<GroupConfig> = vec![toml::from_str(reloaded).unwrap()];
        let new = Groups::rebuild(&new_configs, Some(&old)).unwrap();
        let g = new.get("g").unwrap();
        assert!(g.servers()[0].is_healthy(), "{why}");
        assert_eq!(g.servers()[0].failures(), 1, "{why}");
        let mut addrs: Vec<&str> = g.plan(None).iter().map(|s| s.addr()).collect();
        addrs.sort();
        assert_eq!(addrs, ["a:1", "b:1"], "{why}");
    }
}

#[test]
fn bad_groups_are_refused() {
    for (text, why) in [
        (
            r#"name = "x"
            servers = []"#,
            "no servers",
        ),
        (
            r#"name = "x"
            servers = ["nohost"]"#,
            "not host:port",
        ),
        (
            r#"name = "x"
            servers = ["a:99999"]"#,
            "not host:port",
        ),
        (
            r#"name = "x"
            servers = [{ addr = "a:1", weight = 0 }]"#,
            "weight",
        ),
        (
            r#"name = "x"
            servers = ["a:1", "a:1"]"#,
            "twice",
        ),
        (
            r#"name = "x"
            servers = [{ addr = "a:1", backup = true }]"#,
            "backup",
        ),
        (
            r#"name = "x"
            balance = "hash"
            servers = ["a:1"]"#,
            "hash_key",
        ),
        (
            r#"name = "x"
            servers = ["a:1"]
            health_check = { kind = "http", path = "no-slash" }"#,
            "path",
        ),
        (
            r#"name = "x"
            servers = ["a:1"]
            health_check = { rise = 0 }"#,
            "rise",
        ),
    ] {
        let config: GroupConfig = toml::from_str(text).unwrap();
        let err = Group::new(&config).unwrap_err().to_string();
        assert!(err.contains(why), "{text}: {err}");
    }
    let unknown = toml::from_str::<GroupConfig>(
        r#"name = "x"
        servers = ["a:1"]
        health_check = { kind = "icmp" }"#,
    );
    assert!(unknown.is_err());
}
