//! The `pronto` command line: thin — parse arguments, load config, hand over to the library.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use pronto::config::{Config, Loaded, Resources};
use pronto_core::routing::PolicyKind;

#[derive(Parser)]
#[command(
    name = "pronto",
    version = VERSION,
    about = "A gateway that routes each LLM prompt to the backend with the soonest first token"
)]
struct Cli {
    /// Log line format on stderr: `text` (coloured when stderr is a terminal and NO_COLOR is
    /// unset) or `json` (one object per line, for log collectors).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t = LogFormat::Text,
        env = "PRONTO_LOG_FORMAT"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// `pronto --version`: the package version and the git revision it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (revision ",
    env!("PRONTO_GIT_REVISION"),
    ")"
);

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve(ServeArgs),
    /// Validate a config file: print every error with its location and field path.
    CheckConfig(pronto::config::CheckConfigArgs),
    /// Compare routing policies live on a built-in simulated GPU fleet (one table, a TTFT
    /// CDF), then keep the gateway up for your own requests.
    #[cfg(feature = "tools")]
    Demo(pronto::demo::DemoArgs),
    /// Serve a simulated fleet of OpenAI-compatible GPU backends on loopback.
    #[cfg(feature = "tools")]
    SimFleet(pronto_sim::fleet::SimFleetArgs),
    /// Replay a trace through the engine model on a virtual clock, once per policy.
    #[cfg(feature = "tools")]
    Evaluate(pronto_sim::evaluate::EvaluateArgs),
    /// Measure a live engine and fit a simulator profile to it (writes a profile YAML).
    #[cfg(feature = "tools")]
    Calibrate(pronto_sim::calibrate::CalibrateArgs),
    /// Replay a trace open-loop against a live gateway or backend; write results and plots.
    #[cfg(feature = "tools")]
    Replay(pronto_bench::ReplayArgs),
    /// One table and one TTFT CDF plot over several replays (e.g. one per router).
    #[cfg(feature = "tools")]
    CompareReport(pronto_bench::CompareReportArgs),
    /// Config tooling.
    #[command(subcommand)]
    Config(ConfigCommand),
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the JSON Schema of the gateway config file (for editors).
    Schema,
    /// Print the config reference (every key, type, default and description; the routing
    /// policies' parameters and the routing reasons) as Markdown: docs/config-reference.md.
    Reference,
}

#[derive(Args)]
struct ServeArgs {
    /// YAML config file.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Backend base URL (repeatable); runs without a config file.
    #[arg(long = "backend", value_name = "URL")]
    backends: Vec<String>,
    /// Model name served by the --backend pool. Without it the gateway serves the models the
    /// backends list at `GET /v1/models` (asked at start and again while they change), and
    /// `default` for any backend.
    #[arg(long)]
    model: Option<String>,
    /// Client listener (overrides the file).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Admin listener (overrides the file).
    #[arg(long)]
    admin_listen: Option<SocketAddr>,
    /// Routing policy for the --backend pool.
    #[arg(long, default_value = "predicted_ttft")]
    policy: String,
    /// Add the x-pronto-* explanation headers to responses: the backend, the decision's
    /// reason and predicted TTFT, the runner-up and its prediction, the attempts (with a
    /// config file, set `explain_headers: true` in it).
    #[arg(long, conflicts_with = "config")]
    explain_headers: bool,
}

/// Logs go to stderr, filtered by `RUST_LOG` (default `info`, pingora at `warn`). Text lines
/// are coloured only when stderr is a terminal and `NO_COLOR` is unset or empty
/// (<https://no-color.org>); JSON lines never are, and carry their `target` (the access log's
/// is `pronto::access`).
fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,pingora_core=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(use_colour()).init(),
        // The target tells collectors the access log (`pronto::access`) from the rest.
        LogFormat::Json => builder
            .json()
            .with_target(true)
            .with_ansi(false)
            .flatten_event(true)
            .with_current_span(false)
            .init(),
    }
}

fn use_colour() -> bool {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    !no_color && std::io::stderr().is_terminal()
}

fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let mut config = match (&args.config, args.backends.is_empty()) {
        (Some(path), true) => Loaded::load(path).map_err(|e| anyhow::anyhow!("{e}"))?,
        (None, false) => {
            let policy = PolicyKind::parse(&args.policy).with_context(|| {
                format!(
                    "unknown policy `{}`; expected one of {}",
                    args.policy,
                    PolicyKind::ALL.join(", ")
                )
            })?;
            let config = match &args.model {
                Some(model) => Config::from_backend_urls(&args.backends, model, policy),
                None => Config::from_backend_urls_serving_listed(&args.backends, policy),
            };
            Loaded {
                config: config.map_err(|e| anyhow::anyhow!("{e}"))?,
                resources: Resources::default(),
            }
        }
        (Some(_), false) => {
            anyhow::bail!("give either --config FILE or --backend URL..., not both")
        }
        (None, true) => anyhow::bail!("give --config FILE or at least one --backend URL"),
    };
    if let Some(l) = args.listen {
        config.config.listen = l;
    }
    if args.explain_headers {
        config.config.explain_headers = true;
    }
    if let Some(a) = args.admin_listen {
        config.config.admin_listen = a;
        if let Some(msg) = pronto::config::edge::admin_exposure_error(
            config.config.admin_listen,
            &config.config.admin,
        ) {
            anyhow::bail!("--admin-listen {a}: admin_listen: {msg}");
        }
    }
    pronto::server::run(config)?;
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    let result = match cli.command {
        Command::Serve(a) => serve(a),
        Command::CheckConfig(a) => return pronto::config::run_check_config(&a),
        #[cfg(feature = "tools")]
        Command::Demo(a) => pronto::demo::run_demo(a).map(|()| ExitCode::SUCCESS),
        #[cfg(feature = "tools")]
        Command::SimFleet(a) => tokio::runtime::Runtime::new()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(pronto_sim::fleet::run_sim_fleet(a)))
            .map(|()| ExitCode::SUCCESS),
        #[cfg(feature = "tools")]
        Command::Evaluate(a) => pronto_sim::evaluate::run_evaluate(a).map(|()| ExitCode::SUCCESS),
        #[cfg(feature = "tools")]
        Command::Calibrate(a) => tokio::runtime::Runtime::new()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(pronto_sim::calibrate::run_calibrate(a)))
            .map(|()| ExitCode::SUCCESS),
        #[cfg(feature = "tools")]
        Command::Replay(a) => pronto_bench::run_replay(a).map(|()| ExitCode::SUCCESS),
        #[cfg(feature = "tools")]
        Command::CompareReport(a) => {
            pronto_bench::run_compare_report(a).map(|()| ExitCode::SUCCESS)
        }
        Command::Config(ConfigCommand::Schema) => {
            println!("{}", pronto::config::config_schema());
            Ok(ExitCode::SUCCESS)
        }
        Command::Config(ConfigCommand::Reference) => {
            print!("{}", pronto::config::config_reference());
            Ok(ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
