use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::wire::{self, WireError};
use super::*;
use crate::affinity::{IndexConfig, PrefixIndex};
use crate::ids::BackendId;
use crate::load::Plain;
use crate::predict::Coefficients;

/// Two backends `a`, `b` of pool `m`, by position.
struct Two {
    states: Vec<BackendState<Plain>>,
    index: PrefixIndex,
}

impl Two {
    fn new(t0: Instant) -> Two {
        Two {
            states: ["a", "b"]
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    BackendState::new(BackendId(i as u64), n, Coefficients::default(), t0, None)
                })
                .collect(),
            index: PrefixIndex::new(IndexConfig {
                max_backends: 2,
                ..IndexConfig::default()
            }),
        }
    }

    fn held(&self, hashes: &[BlockHash], now: Instant) -> [u32; 2] {
        let mut out = [0; 2];
        self.index.match_lengths(hashes, now, &mut out);
        out
    }
}

impl Local for Two {
    type Handle = usize;
    type Storage = Plain;
    fn resolve(&self, backend: BackendRef) -> Option<usize> {
        ["a", "b"]
            .iter()
            .position(|n| BackendRef::of("m", n) == backend)
    }
    fn state<'a>(&'a self, h: &'a usize) -> &'a BackendState<Plain> {
        &self.states[*h]
    }
    fn record(&self, h: &usize, hashes: &[BlockHash], now: Instant) {
        self.index.record(*h, hashes, now);
    }
}

fn load(p: u32) -> RequestLoad {
    RequestLoad {
        prefill_tokens: p,
        kv_tokens: u64::from(p) + 100,
    }
}

fn dispatch(seq: u64, backend: &str, p: u32, hashes: &[u64]) -> SyncEvent {
    SyncEvent::Dispatch {
        seq,
        backend: BackendRef::of("m", backend),
        load: load(p),
        hashes: hashes.iter().copied().map(BlockHash).collect(),
    }
}

const R1: ReplicaId = ReplicaId(1);
const R2: ReplicaId = ReplicaId(2);

#[test]
fn a_remote_request_is_booked_recorded_observed_and_released() {
    let t0 = Instant::now();
    let local = Two::new(t0);
    let mut remote = Remote::new(Duration::from_secs(3));
    let f = remote.apply(&local, R1, 7, &[dispatch(1, "b", 800, &[11, 12, 13])], t0);
    assert_eq!(f.applied, 1);
    let v = local.states[1].load(t0);
    assert_eq!((v.inflight, v.outstanding_prefill_tokens), (1, 800));
    assert_eq!(v.kv_reserved_tokens, 900);
    let hashes: Vec<BlockHash> = [11, 12, 13, 14].map(BlockHash).to_vec();
    assert_eq!(
        local.held(&hashes, t0),
        [0, 3],
        "the prefix is recorded under b"
    );
    let obs = Observation {
        inputs: TtftInputs {
            uncached_tokens: 800.0,
            ..TtftInputs::default()
        },
        ttft_s: 0.3,
    };
    let first = SyncEvent::FirstToken {
        seq: 1,
        observed: Some(obs),
    };
    remote.apply(&local, R1, 7, std::slice::from_ref(&first), t0);
    remote.apply(&local, R1, 7, &[first], t0);
    let v = local.states[1].load(t0);
    assert_eq!((v.outstanding_prefill_tokens, v.running_decodes), (0, 1));
    let m = local.states[1].ttft.view(t0);
    assert_eq!(
        m.quality.samples, 1,
        "learns once, from the first first-token"
    );
    remote.apply(&local, R1, 7, &[SyncEvent::Release { seq: 1 }], t0);
    let v = local.states[1].load(t0);
    assert_eq!(
        (v.inflight, v.running_decodes, v.kv_reserved_tokens),
        (0, 0, 0)
    );
    assert_eq!(remote.bookings(), 0);
}

#[test]
fn a_silent_replica_expires_and_only_its_bookings_go() {
    let t0 = Instant::now();
    let local = Two::new(t0);
    let mut remote = Remote::new(Duration::from_secs(3));
    remote.apply(&local, R1, 1, &[dispatch(1, "a", 100, &[])], t0);
    remote.apply(&local, R2, 1, &[dispatch(1, "a", 50, &[])], t0);
    assert_eq!(local.states[0].load(t0).outstanding_prefill_tokens, 150);
    let t2 = t0 + Duration::from_secs(2);
    remote.apply(&local, R2, 1, &[], t2);
    assert_eq!(
        remote.expire(&local, t0 + Duration::from_secs(3)),
        0,
        "not yet"
    );
    assert_eq!(remote.expire(&local, t0 + Duration::from_millis(3001)), 1);
    let v = local.states[0].load(t2);
    assert_eq!((v.inflight, v.outstanding_prefill_tokens), (1, 50));
    assert_eq!(remote.peers(), 1);
    // R1 comes back: its next snapshot restores what it holds.
    let live = vec![LiveBooking {
        seq: 1,
        backend: BackendRef::of("m", "a"),
        load: load(100),
        decoding: true,
    }];
    let t4 = t0 + Duration::from_secs(4);
    remote.apply(&local, R1, 1, &[SyncEvent::Snapshot { live }], t4);
    let v = local.states[0].load(t4);
    assert_eq!(
        (v.inflight, v.outstanding_prefill_tokens, v.running_decodes),
        (2, 50, 1)
    );
}

#[test]
fn a_snapshot_repairs_lost_events_and_a_restart_starts_afresh() {
    let t0 = Instant::now();
    let local = Two::new(t0);
    let mut remote = Remote::new(Duration::from_secs(3));
    remote.apply(
        &local,
        R1,
        1,
        &[dispatch(1, "a", 100, &[]), dispatch(2, "b", 200, &[])],
        t0,
    );
    // Release of 1 and dispatch of 3 were lost; the snapshot says 2 (decoding) and 3.
    let live = vec![
        LiveBooking {
            seq: 2,
            backend: BackendRef::of("m", "b"),
            load: load(200),
            decoding: true,
        },
        LiveBooking {
            seq: 3,
            backend: BackendRef::of("m", "a"),
            load: load(30),
            decoding: false,
        },
    ];
    let f = remote.apply(&local, R1, 1, &[SyncEvent::Snapshot { live }], t0);
    assert_eq!(f.reconciled, 1);
    let (a, b) = (local.states[0].load(t0), local.states[1].load(t0));
    assert_eq!((a.inflight, a.outstanding_prefill_tokens), (1, 30));
    assert_eq!(
        (b.inflight, b.outstanding_prefill_tokens, b.running_decodes),
        (1, 0, 1)
    );
    // R1 restarts: seq numbers start over, what it held before is gone.
    let f = remote.apply(&local, R1, 2, &[dispatch(1, "b", 5, &[])], t0);
    assert_eq!(f.reconciled, 2);
    let (a, b) = (local.states[0].load(t0), local.states[1].load(t0));
    assert_eq!(
        (a.inflight, b.inflight, b.outstanding_prefill_tokens),
        (0, 1, 5)
    );
    // Events about a backend or booking this replica does not know are counted, not applied.
    let f = remote.apply(
        &local,
        R1,
        2,
        &[dispatch(9, "z", 5, &[1]), SyncEvent::Release { seq: 42 }],
        t0,
    );
    assert_eq!((f.applied, f.unknown_backend, f.unknown_booking), (0, 1, 1));
    remote.clear(&local);
    assert_eq!(local.states[1].load(t0).inflight, 0);
}

#[test]
fn the_outbox_tracks_live_bookings_and_rate_limits_observations() {
    let t0 = Instant::now();
    // One observation per backend per 50 ms on average, two at once.
    let mut out = Outbox::new(ObserveLimit {
        per_second: 20.0,
        burst: 2.0,
    });
    let obs = Some(Observation {
        inputs: TtftInputs::default(),
        ttft_s: 0.1,
    });
    for seq in [1, 2, 3, 5, 6, 7] {
        out.note(dispatch(seq, "a", 10, &[1]), t0);
    }
    out.note(dispatch(4, "b", 10, &[1]), t0);
    let first = |seq| SyncEvent::FirstToken { seq, observed: obs };
    let kept = |ev: SyncEvent| {
        matches!(
            ev,
            SyncEvent::FirstToken {
                observed: Some(_),
                ..
            }
        )
    };
    let ms = |n| t0 + Duration::from_millis(n);
    assert!(kept(out.note(first(1), t0)));
    assert!(kept(out.note(first(2), t0)), "a burst of two");
    assert!(!kept(out.note(first(5), ms(10))), "same backend, too soon");
    assert!(kept(out.note(first(4), ms(10))), "another backend");
    assert!(kept(out.note(first(3), ms(60))), "refilled");
    assert!(!kept(out.note(first(6), ms(60))));
    assert!(
        !kept(out.note(first(99), t0)),
        "unknown booking: nothing to say"
    );
    out.note(SyncEvent::Release { seq: 2 }, t0);
    let SyncEvent::Snapshot { live } = out.snapshot() else {
        panic!("a snapshot")
    };
    let decoding: Vec<u64> = live.iter().filter(|l| l.decoding).map(|l| l.seq).collect();
    assert_eq!(decoding, [1, 3, 4, 5, 6]);
    assert_eq!(live.len(), 6, "2 was released; 7 is still in prefill");
}

fn sample_events() -> Vec<SyncEvent> {
    vec![
        dispatch(300, "a", 12_000, &[1, u64::MAX, 3]),
        SyncEvent::FirstToken {
            seq: 300,
            observed: None,
        },
        SyncEvent::FirstToken {
            seq: 301,
            observed: Some(Observation {
                inputs: TtftInputs {
                    queued_prefill_tokens: 4096.0,
                    queued_prefill_sq: 1.5,
                    uncached_tokens: 512.0,
                    running_decodes: 3.0,
                    engine_waiting: 1.0,
                },
                ttft_s: 0.25,
            }),
        },
        SyncEvent::Release { seq: 1 << 40 },
        SyncEvent::Snapshot {
            live: vec![LiveBooking {
                seq: 5,
                backend: BackendRef::of("m", "b"),
                load: load(7),
                decoding: true,
            }],
        },
        SyncEvent::Snapshot { live: vec![] },
    ]
}

#[test]
fn messages_round_trip_and_cost_what_the_docs_say() {
    let events = sample_events();
    let bytes = wire::encode(42, &events);
    assert_eq!(wire::decode(&bytes), Ok((42, events.clone())));
    assert_eq!(wire::incarnation(&bytes), Some(42));
    assert_eq!(wire::incarnation(&bytes[..8]), None);
    // A dispatch: tag, seq (2 bytes), backend, prefill (2), kv (2), count, 8 per hash.
    assert_eq!(wire::event_len(&events[0]), 1 + 2 + 8 + 2 + 2 + 1 + 3 * 8);
    assert_eq!(wire::event_len(&SyncEvent::Release { seq: 100 }), 2);
    assert_eq!(wire::event_len(&events[2]), 1 + 2 + 24);
    assert_eq!(wire::decode(&wire::encode(1, &[])), Ok((1, vec![])));
    assert_eq!(wire::decode(&[9]), Err(WireError::Version(9)));
    let mut bad = wire::encode(1, &[]);
    bad.push(77);
    assert_eq!(wire::decode(&bad), Err(WireError::Tag(77)));
    // Every proper prefix past the header is an error, never a panic or a wrong message.
    for n in 0..bytes.len() {
        let r = wire::decode(&bytes[..n]);
        assert!(
            r.is_err() || r.as_ref().is_ok_and(|(_, e)| e.len() < events.len()),
            "{n}"
        );
    }
}

proptest! {
    #[test]
    fn decoding_any_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = wire::decode(&bytes);
        let mut with_header = wire::encode(3, &[]);
        with_header.extend_from_slice(&bytes);
        let _ = wire::decode(&with_header);
    }
}

#[test]
fn remote_dispatches_and_echoes_give_what_a_decision_has_not_heard_of() {
    let t0 = Instant::now();
    let local = Two::new(t0);
    let mut remote: Remote<usize> = Remote::new(Duration::from_secs(3));
    // Replica 1 sends 10 dispatches a second for 5 s; 50 ms echoes.
    for i in 0..50u64 {
        let at = t0 + Duration::from_millis(100 * i);
        remote.apply(&local, R1, 7, &[dispatch(i + 1, "a", 2000, &[])], at);
        remote.apply(&local, R1, 7, &[SyncEvent::Release { seq: i + 1 }], at);
    }
    let now = t0 + Duration::from_millis(4_900);
    assert_eq!(remote.unseen().expected(now), 0.0, "no delay measured yet");
    remote.on_echo(Duration::from_millis(50));
    let w = remote.unseen().expected(now);
    assert!((w - 0.5).abs() < 0.05, "10/s × 50 ms: {w}");
    // A release or a first token is not a dispatch.
    remote.apply(&local, R1, 7, &[SyncEvent::Release { seq: 99 }], now);
    assert_eq!(remote.unseen().expected(now), w);
}
