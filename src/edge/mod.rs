//! The edge: what a request must pass before it is routed. Framing and the head deadline
//! (the request head read in time and well-formed), authentication and authorization
//! ([`auth`]), rate limits ([`ratelimit`]), and SLO admission ([`admission`], driven by
//! `admit`), with the gate that applies them per request (`gate`).

pub mod admission;
pub(crate) mod admit;
pub mod auth;
pub mod framing;
pub(crate) mod gate;
pub mod head_deadline;
pub mod ratelimit;
