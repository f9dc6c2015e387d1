//! Model names between the client and the backends: what a pool that serves its backends'
//! models offers ([`served`]), and the rewriting of a request's model to the name a backend
//! knows it by and back in its answer ([`rename`]). Listing the backends' models is a
//! background loop (`services::models`); answering `GET /v1/models` is the proxy's.

#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod rename;
pub mod served;
