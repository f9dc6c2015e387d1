//! Arbitrary text as a config file: the loader never panics and its errors are located
//! inside the text (`pronto::fuzzing::config_loader`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| pronto::fuzzing::config_loader(data));
