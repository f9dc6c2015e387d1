//! The fitted parameters: the profile's timing terms as one vector θ, and times as linear
//! forms over it.
//!
//! Every time the simulator produces is a sum of step times, front-end costs and the output
//! latency, each linear in the profile's coefficients. So for a fixed schedule a time is a
//! [`Lin`] — a feature vector `x` with `time_ms = x · θ` — and fitting θ to measured times is a
//! least-squares problem (see [`super::fit`]).

use crate::profile::{Profile, StepWork};

/// Number of timing parameters.
pub const N: usize = 9;

/// One timing parameter of a profile (all in milliseconds, see [`crate::profile`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Param {
    /// `step.floor_ms`: every step.
    Floor,
    /// `step.prefill_step_ms`: a step with prefill work.
    PrefillStep,
    /// `step.prefill_ms_per_token`: per prefill token.
    PrefillPerToken,
    /// `step.attn_ms_per_mpair`: per million causal attention pairs.
    AttnPerMpair,
    /// `step.decode_ms_per_seq`: per decoding sequence.
    DecodePerSeq,
    /// `step.decode_ms_per_kctx`: per thousand context tokens of decoders.
    DecodePerKctx,
    /// `frontend.request_ms`: serialised per-request front-end cost.
    FrontendRequest,
    /// `frontend.ms_per_prompt_token`: serialised front-end cost per prompt token.
    FrontendPerToken,
    /// `frontend.latency_ms`: output latency of every token.
    Latency,
}

impl Param {
    /// Every parameter, in vector order.
    pub const ALL: [Param; N] = [
        Param::Floor,
        Param::PrefillStep,
        Param::PrefillPerToken,
        Param::AttnPerMpair,
        Param::DecodePerSeq,
        Param::DecodePerKctx,
        Param::FrontendRequest,
        Param::FrontendPerToken,
        Param::Latency,
    ];

    /// Index in θ.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The profile field, `section.name`.
    pub fn field(self) -> &'static str {
        match self {
            Param::Floor => "step.floor_ms",
            Param::PrefillStep => "step.prefill_step_ms",
            Param::PrefillPerToken => "step.prefill_ms_per_token",
            Param::AttnPerMpair => "step.attn_ms_per_mpair",
            Param::DecodePerSeq => "step.decode_ms_per_seq",
            Param::DecodePerKctx => "step.decode_ms_per_kctx",
            Param::FrontendRequest => "frontend.request_ms",
            Param::FrontendPerToken => "frontend.ms_per_prompt_token",
            Param::Latency => "frontend.latency_ms",
        }
    }

    /// The field name without its section (what `--fix` and `--params` take).
    pub fn name(self) -> &'static str {
        let f = self.field();
        &f[f.find('.').map_or(0, |i| i + 1)..]
    }

    /// A parameter by [`Param::name`] or [`Param::field`].
    pub fn parse(s: &str) -> Option<Param> {
        Param::ALL
            .into_iter()
            .find(|p| p.name() == s || p.field() == s)
    }
}

/// θ: one value per [`Param`], milliseconds.
pub type Theta = [f64; N];

/// A profile's timing parameters.
pub fn theta_of(p: &Profile) -> Theta {
    let (s, f) = (&p.step, &p.frontend);
    [
        s.floor_ms,
        s.prefill_step_ms,
        s.prefill_ms_per_token,
        s.attn_ms_per_mpair,
        s.decode_ms_per_seq,
        s.decode_ms_per_kctx,
        f.request_ms,
        f.ms_per_prompt_token,
        f.latency_ms,
    ]
}

/// `p` with its timing parameters replaced by `theta`.
pub fn with_theta(p: &Profile, theta: &Theta) -> Profile {
    let mut p = p.clone();
    let (s, f) = (&mut p.step, &mut p.frontend);
    [
        s.floor_ms,
        s.prefill_step_ms,
        s.prefill_ms_per_token,
        s.attn_ms_per_mpair,
        s.decode_ms_per_seq,
        s.decode_ms_per_kctx,
        f.request_ms,
        f.ms_per_prompt_token,
        f.latency_ms,
    ] = *theta;
    p
}

/// A time as a linear form over θ: `ms = x · θ`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Lin(pub [f64; N]);

impl Lin {
    /// Zero.
    pub const ZERO: Lin = Lin([0.0; N]);

    /// `k` units of one parameter.
    pub fn unit(p: Param, k: f64) -> Lin {
        let mut x = [0.0; N];
        x[p.index()] = k;
        Lin(x)
    }

    /// The time of one engine step that computed `w` (see [`Profile::step_seconds`]).
    pub fn step(w: &StepWork) -> Lin {
        let mut x = [0.0; N];
        x[Param::Floor.index()] = 1.0;
        if w.prefill_tokens > 0 {
            x[Param::PrefillStep.index()] = 1.0;
        }
        x[Param::PrefillPerToken.index()] = w.prefill_tokens as f64;
        x[Param::AttnPerMpair.index()] = w.prefill_pairs / 1e6;
        x[Param::DecodePerSeq.index()] = w.decode_seqs as f64;
        x[Param::DecodePerKctx.index()] = w.decode_ctx_tokens as f64 / 1e3;
        Lin(x)
    }

    /// The front-end time of one request of `n` prompt tokens.
    pub fn frontend(n: usize) -> Lin {
        Lin::unit(Param::FrontendRequest, 1.0) + Lin::unit(Param::FrontendPerToken, n as f64)
    }

    /// Its value at θ, milliseconds.
    pub fn at(&self, theta: &Theta) -> f64 {
        self.0.iter().zip(theta).map(|(x, t)| x * t).sum()
    }

    /// `self · k`.
    pub fn scale(self, k: f64) -> Lin {
        Lin(self.0.map(|x| x * k))
    }
}

impl std::ops::Add for Lin {
    type Output = Lin;
    fn add(mut self, o: Lin) -> Lin {
        for (a, b) in self.0.iter_mut().zip(o.0) {
            *a += b;
        }
        self
    }
}

impl std::ops::Sub for Lin {
    type Output = Lin;
    fn sub(self, o: Lin) -> Lin {
        self + o.scale(-1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_theta_round_trips() {
        for p in Param::ALL {
            assert_eq!(Param::parse(p.name()), Some(p));
            assert_eq!(Param::parse(p.field()), Some(p));
            assert_eq!(Param::ALL[p.index()], p);
        }
        assert_eq!(Param::parse("nope"), None);
        let base = Profile::builtin("h100-llama3-8b").unwrap();
        let theta: Theta = std::array::from_fn(|i| i as f64 + 0.5);
        assert_eq!(theta_of(&with_theta(&base, &theta)), theta);
        assert_eq!(with_theta(&base, &theta_of(&base)), base);
    }

    /// A step's linear form evaluates to the profile's own step time.
    #[test]
    fn step_form_matches_the_profile() {
        let mut p = Profile::builtin("h100-llama3-8b").unwrap();
        p.step.prefill_step_ms = 1.5;
        let theta = theta_of(&p);
        for w in [
            StepWork {
                prefill_tokens: 3000,
                prefill_pairs: 4.5e6,
                decode_seqs: 7,
                decode_ctx_tokens: 9000,
            },
            StepWork {
                decode_seqs: 3,
                decode_ctx_tokens: 600,
                ..StepWork::default()
            },
        ] {
            let want = p.step_seconds(&w) * 1e3;
            assert!((Lin::step(&w).at(&theta) - want).abs() < 1e-9, "{w:?}");
        }
        let fe = Lin::frontend(1000) + Lin::unit(Param::Latency, 1.0);
        assert_eq!(fe.at(&theta), 0.0);
        assert_eq!((fe - fe).at(&[1.0; N]), 0.0);
    }
}
