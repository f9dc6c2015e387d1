//! Unit tests for `validate`: a backend's engine-side settings (KV events, tokenizer files).

use super::tests::*;

#[test]
fn kv_events_endpoint_and_block_size_are_checked() {
    let yaml = with_backend(
        "{name: a, url: 'http://h:1', kv_events: {endpoint: 'tcp://10.0.0.1:5557', block_size: 128}}",
    );
    let (c, _) = run(&yaml).unwrap();
    let k = c.pools[0].backends[0].kv_events.clone().unwrap();
    assert_eq!(
        (k.endpoint.as_str(), k.block_size),
        ("tcp://10.0.0.1:5557", 128)
    );
    assert_eq!(c.pools[0].backends[1].kv_events, None);
    let yaml = with_backend(
        "{name: a, url: 'http://h:1', kv_events: {endpoint: 'http://h:5557', block_size: 0}}",
    );
    assert_eq!(
        errors(&yaml),
        vec![
            pair(
                "pools.m.backends[0].kv_events.endpoint",
                "`http://h:5557` is not `tcp://HOST:PORT`"
            ),
            pair(
                "pools.m.backends[0].kv_events.block_size",
                "must be between 1 and 65536, got 0"
            ),
        ]
    );
    let yaml = with_backend("{name: a, url: 'http://h:1', kv_events: {}}");
    let paths: Vec<String> = errors(&yaml).into_iter().map(|(p, _)| p).collect();
    assert_eq!(
        paths,
        [
            "pools.m.backends[0].kv_events.endpoint",
            "pools.m.backends[0].kv_events.block_size"
        ]
    );
}

#[test]
fn tokenizer_files_are_loaded_and_located() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/examples/tokenizer");
    let with = |extra: &str| {
        format!(
            "pools:\n  m:\n{extra}    backends:\n      - {{name: a, url: 'http://127.0.0.1:8001'}}\n      - {{name: b, url: 'http://127.0.0.1:8002'}}\n"
        )
    };
    // A model directory: the tokenizer and the template beside it.
    let (config, resources, warns) =
        run_loaded(&with(&format!("    tokenizer: {}\n", dir.display()))).unwrap();
    assert!(warns.is_empty(), "{warns:?}");
    let named = config.pools[0].tokenizer.as_ref().expect("named");
    assert_eq!(named.path, dir.join("tokenizer.json"));
    assert!(resources.cover(&config));
    let tok = resources.tokenizer("m").expect("loaded");
    assert!(tok.has_chat_template());
    assert_eq!(tok.path(), dir.join("tokenizer.json"));
    assert_eq!(named.fingerprint, tok.fingerprint());
    // The same files load equal (a reload keeps what the pool learned).
    let (again, _) = run(&with(&format!("    tokenizer: {}\n", dir.display()))).unwrap();
    assert_eq!(config.pools[0], again.pools[0]);

    let (path, message) = one_error(&with("    tokenizer: /nonexistent/tok.json\n"));
    assert_eq!(path, "pools.m.tokenizer");
    assert!(
        message.contains("cannot read /nonexistent/tok.json"),
        "{message}"
    );

    let (path, message) = one_error(&with(&format!(
        "    tokenizer: {}\n",
        dir.join("chat_template.jinja").display()
    )));
    assert_eq!(path, "pools.m.tokenizer");
    assert!(message.contains("is not a tokenizer.json"), "{message}");

    assert_eq!(
        one_error(&with("    chat_template: /x.jinja\n")),
        pair(
            "pools.m.chat_template",
            "needs `tokenizer` (the template renders prompts for that tokenizer)"
        )
    );
    let (path, message) = one_error(&with(&format!(
        "    tokenizer: {}\n    chat_template: /nonexistent.jinja\n",
        dir.display()
    )));
    assert_eq!(path, "pools.m.chat_template");
    assert!(message.contains("is not a file"), "{message}");

    // The bare tokenizer.json of a directory without a template: a warning, chat estimated.
    let bare = std::env::temp_dir().join(format!("pronto-bare-tok-{}", std::process::id()));
    std::fs::create_dir_all(&bare).unwrap();
    std::fs::copy(dir.join("tokenizer.json"), bare.join("tokenizer.json")).unwrap();
    let w = warnings(&with(&format!("    tokenizer: {}\n", bare.display())));
    std::fs::remove_dir_all(&bare).unwrap();
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].0, "pools.m.tokenizer");
    assert!(w[0].1.contains("no chat template"), "{}", w[0].1);
}

#[test]
fn tiktoken_encodings_need_no_files() {
    let with = |extra: &str| {
        format!(
            "pools:\n  m:\n{extra}    backends:\n      - {{name: a, url: 'http://127.0.0.1:8001'}}\n      - {{name: b, url: 'http://127.0.0.1:8002'}}\n"
        )
    };
    // No template and no warning: OpenAI's chat format is built in.
    let (_, resources, warns) = run_loaded(&with("    tokenizer: tiktoken:o200k_base\n")).unwrap();
    assert!(warns.is_empty(), "{warns:?}");
    let tok = resources.tokenizer("m").expect("loaded");
    assert_eq!(tok.tiktoken_encoding(), Some("o200k_base"));

    let (path, message) = one_error(&with("    tokenizer: tiktoken:nope\n"));
    assert_eq!(path, "pools.m.tokenizer");
    assert!(
        message.starts_with("unknown tiktoken encoding \"nope\" (one of: o200k_base, "),
        "{message}"
    );

    // In a file, the encoding is not a relative path; the template beside it is.
    let text = with("    tokenizer: tiktoken:gpt-4o\n");
    let file = std::path::Path::new("/etc/pronto/pronto.yaml");
    let config = crate::config::Config::from_file_text(file, &text).unwrap();
    let tok = config.pools[0].tokenizer.as_ref().expect("named");
    assert_eq!(tok.path, std::path::Path::new("tiktoken:gpt-4o"));
    let text = with("    tokenizer: tiktoken:gpt-4o\n    chat_template: t.jinja\n");
    let e = crate::config::Config::from_file_text(file, &text).unwrap_err();
    let errors: Vec<(&str, &str)> = e
        .errors
        .iter()
        .map(|d| (d.path.as_str(), d.message.as_str()))
        .collect();
    assert_eq!(
        errors,
        [("pools.m.chat_template", "/etc/pronto/t.jinja is not a file")]
    );
}
