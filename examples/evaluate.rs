//! Run the offline evaluator outside the CLI (until `pronto evaluate` is wired), e.g.
//! `cargo run --release --example evaluate -- --trace ../shared/traces/mooncake/conversation_trace.jsonl --load 0.8`.

use clap::Parser;
use pronto_sim::evaluate::{run_evaluate, EvaluateArgs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: EvaluateArgs,
}

fn main() -> anyhow::Result<()> {
    run_evaluate(Cli::parse().args)
}
