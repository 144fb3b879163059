//! Parse and structure tests: one per construct, plus recovery.

use super::*;
use crate::diagnostics::codes;
use crate::source::SourceMap;

fn parse_text(text: &str) -> Parsed {
    let id = SourceMap::new().add("test.policy", text);
    parse(id, text)
}

fn parse_clean(text: &str) -> PolicyFile {
    let parsed = parse_text(text);
    assert!(
        parsed.diagnostics.is_empty(),
        "unexpected diagnostics: {:#?}",
        parsed.diagnostics
    );
    parsed.file
}

fn only_item(text: &str) -> Item {
    let mut file = parse_clean(text);
    assert_eq!(file.items.len(), 1, "{:#?}", file.items);
    file.items.remove(0)
}

fn expr(text: &str) -> Expr {
    let id = SourceMap::new().add("e", text);
    let (expr, diagnostics) = parse_expression(id, text);
    assert!(diagnostics.is_empty(), "{diagnostics:#?}");
    expr.unwrap()
}

fn path(text: &str) -> Expr {
    expr(text)
}

fn bin(op: BinaryOp, lhs: Expr, rhs: Expr) -> ExprKind {
    ExprKind::Binary(op, Box::new(lhs), Box::new(rhs))
}

#[test]
fn policy_header_names_its_data_files() {
    let Item::Policy(policy) = only_item(
        "policy acme {\n  catalog \"acme/catalog.yaml\"\n  tenants \"acme/tenants.yaml\"\n}\n",
    ) else {
        panic!("not a policy header")
    };
    assert_eq!(policy.name.name, "acme");
    assert_eq!(policy.settings.len(), 2);
    assert_eq!(policy.settings[0].kind, DataFileKind::Catalog);
    assert_eq!(policy.settings[1].path.value, "acme/tenants.yaml");
}

#[test]
fn models_block_has_sources_pins_credentials_and_unknown_tiers() {
    let Item::Models(models) = only_item(
        r#"models {
          from request.model, input.models
          pin "{provider}:{model}"
          pin "@{credential}/{model}"
          credentials one by credential.owned desc else no_key
          unknown serve where request.model in provider.listing by provider.default desc
          unknown error model_not_found
          one provider per model
        }"#,
    ) else {
        panic!()
    };
    assert_eq!(models.statements.len(), 7);
    let ModelsStmt::Pin(pin) = &models.statements[2] else {
        panic!()
    };
    assert_eq!(pin.target, PinTarget::Credential);
    assert_eq!(pin.prefix, "@");
    assert_eq!(pin.separator, "/");
    let ModelsStmt::Credentials {
        mode: CredentialMode::One(keys),
        ..
    } = &models.statements[3]
    else {
        panic!()
    };
    assert!(keys[0].descending);
    assert!(matches!(
        models.statements[6],
        ModelsStmt::OneProviderPerModel { .. }
    ));
}

#[test]
fn bad_pin_templates_are_reported() {
    let parsed = parse_text("models {\n  pin \"{model}\"\n}\n");
    assert_eq!(parsed.diagnostics[0].code, codes::BAD_PIN_TEMPLATE);
    let parsed = parse_text("models {\n  pin \"{provider}{model}\"\n}\n");
    assert_eq!(parsed.diagnostics[0].code, codes::BAD_PIN_TEMPLATE);
}

#[test]
fn input_declares_source_type_shorthand_and_errors() {
    let Item::Input(input) = only_item(
        r#"input provider from body "provider" : {
            order: list<provider>,
            sort: one of [privacy, price],
            max_price: { input: number, output: number },
            max_attempts: int 1..3,
          }
          shorthand provider => { only: [it], allow_fallbacks: false }
          malformed error invalid_request
          unknown error invalid_provider_policy"#,
    ) else {
        panic!()
    };
    assert_eq!(input.source, InputSource::Body);
    assert_eq!(input.source_name.value, "provider");
    let TypeExprKind::Object(fields) = &input.ty.kind else {
        panic!()
    };
    assert_eq!(fields.len(), 4);
    assert!(
        matches!(fields[3].ty.kind, TypeExprKind::IntRange { low, high } if low == 1.0 && high == 3.0)
    );
    assert!(input.shorthand.is_some());
    assert_eq!(input.malformed_error.unwrap().name, "invalid_request");
    assert_eq!(input.unknown_error.unwrap().name, "invalid_provider_policy");
}

#[test]
fn header_inputs_and_like_types() {
    let file = parse_clean(
        "input order from header \"x-order\" : csv<provider>\n  malformed error bad\ninput bound from header \"x-b\" : like order\n  malformed error bad\n",
    );
    let Item::Input(first) = &file.items[0] else {
        panic!()
    };
    assert_eq!(first.source, InputSource::Header);
    assert!(matches!(first.ty.kind, TypeExprKind::Csv(_)));
    let Item::Input(second) = &file.items[1] else {
        panic!()
    };
    assert!(matches!(&second.ty.kind, TypeExprKind::Like(name) if name.name == "order"));
}

#[test]
fn validate_merge_defaults_and_let() {
    let file = parse_clean(
        r#"validate {
          malformed body error bad_body
          reject intersects(input.p.only, input.p.ignore) error conflict
        }
        defaults {
          layers workspace.model, workspace, tenant.model, tenant
        }
        merge {
          only = intersect(input.p.only, defaults.allowed) strict invalid_request
          attempts = min(input.p.max_attempts, defaults.max_attempts)
        }
        let own = credential.owned"#,
    );
    assert_eq!(file.items.len(), 4);
    let Item::Defaults(defaults) = &file.items[1] else {
        panic!()
    };
    assert_eq!(defaults.layers.len(), 4);
    assert!(defaults.layers[0].per_model);
    assert_eq!(defaults.layers[1].level, Level::Workspace);
    let Item::Merge(merge) = &file.items[2] else {
        panic!()
    };
    assert_eq!(merge.merges[0].op, MergeOp::Intersect);
    assert_eq!(
        merge.merges[0].strict.as_ref().unwrap().name,
        "invalid_request"
    );
    assert_eq!(merge.merges[1].op, MergeOp::Min);
}

#[test]
fn eligibility_steps_in_order() {
    let Item::Eligibility(block) = only_item(
        "eligibility {\n  require model.kind == request.kind else wrong_endpoint\n  prefer exclusively credential.owned\n}\n",
    ) else {
        panic!()
    };
    assert!(
        matches!(&block.steps[0], Step::Require { error, .. } if error.name == "wrong_endpoint")
    );
    assert!(matches!(block.steps[1], Step::PreferExclusively { .. }));
}

#[test]
fn order_sorts_and_keys() {
    let file = parse_clean(
        "order {\n  by index_of(input.order, provider.name)\n  by price asc nulls first\n  use sort chosen\n}\nsort privacy {\n  by route.tier desc\n}\n",
    );
    let Item::Order(order) = &file.items[0] else {
        panic!()
    };
    let OrderStmt::By(key) = &order.statements[1] else {
        panic!()
    };
    assert!(!key.descending && key.nulls_first);
    assert!(matches!(order.statements[2], OrderStmt::UseSort { .. }));
    let Item::Sort(sort) = &file.items[1] else {
        panic!()
    };
    assert_eq!(sort.name.name, "privacy");
    assert!(sort.keys[0].descending);
}

#[test]
fn balance_strategies() {
    let file = parse_clean(
        "balance round_robin when lb\nbalance weighted by credential.weight\nbalance share by score within 10% among rank, health.penalized when sort == \"default\"\nbalance least_busy\nbalance random\n",
    );
    let strategies: Vec<&Strategy> = file
        .items
        .iter()
        .map(|item| match item {
            Item::Balance(balance) => &balance.strategy,
            _ => panic!(),
        })
        .collect();
    assert_eq!(strategies[0], &Strategy::RoundRobin);
    assert!(matches!(strategies[1], Strategy::Weighted(_)));
    let Strategy::Share {
        tolerance, among, ..
    } = strategies[2]
    else {
        panic!()
    };
    assert!((tolerance - 0.1).abs() < 1e-12);
    assert_eq!(among.len(), 2);
    assert_eq!(strategies[3], &Strategy::LeastBusy);
    assert_eq!(strategies[4], &Strategy::Random);
}

#[test]
fn failover_statements_and_outcome_rules() {
    let Item::Failover(block) = only_item(
        r#"failover {
          attempts 3
          reorder by provider.priority desc, weighted_price
          keep prev.own implies own
          budget 30s error total_timeout
          on connect_error, reset, timeout => next, penalize route, error unreachable
          on 429 when not own => next, pause provider for clamp(coalesce(upstream.retry_after, 10s), 1s, 60s), error exhausted
          on 5xx, 40x => retry after backoff(1s, 2, 30s, 50%)
          on 400 => stop, error passthrough if attempts == 1 else fallback_exhausted
        }"#,
    ) else {
        panic!()
    };
    assert_eq!(block.statements.len(), 8);
    let FailoverStmt::On(rule) = &block.statements[4] else {
        panic!()
    };
    assert_eq!(rule.outcomes.len(), 3);
    assert_eq!(rule.outcomes[2].kind, OutcomeKind::Timeout);
    let FailoverStmt::On(rule) = &block.statements[6] else {
        panic!()
    };
    assert_eq!(
        rule.outcomes[0].kind,
        OutcomeKind::Status {
            low: 500,
            high: 599
        }
    );
    assert_eq!(
        rule.outcomes[1].kind,
        OutcomeKind::Status {
            low: 400,
            high: 409
        }
    );
    let FailoverStmt::On(rule) = &block.statements[7] else {
        panic!()
    };
    let Consequence::Error(choice) = &rule.consequences[1] else {
        panic!()
    };
    let names: Vec<&str> = choice.names().iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["passthrough", "fallback_exhausted"]);
}

#[test]
fn bad_status_patterns_are_reported() {
    let parsed = parse_text("failover {\n  on 6xx => stop\n}\n");
    assert_eq!(parsed.diagnostics[0].code, codes::BAD_STATUS_PATTERN);
    let parsed = parse_text("failover {\n  on 4x1 => stop\n}\n");
    assert!(!parsed.diagnostics.is_empty());
    // A mistyped class is a status problem, not a duration's.
    let parsed = parse_text("failover {\n  on 5xy => stop\n}\n");
    assert_eq!(parsed.diagnostics[0].code, codes::BAD_STATUS_PATTERN);
    // After `=>` a malformed word is a duration again.
    let parsed = parse_text("failover {\n  on 503 => retry after 10x\n}\n");
    assert_eq!(parsed.diagnostics[0].code, codes::BAD_LITERAL);
}

#[test]
fn health_capacity_timeouts_stream() {
    let file = parse_clean(
        r#"health {
          penalty base 30s factor 2 max 5m reset 10m
          window 24h
        }
        capacity {
          wait 10s
          error capacity_exhausted
        }
        timeouts {
          connect 5s
          idle if provider.format == "anthropic" then 60s else 300s
        }
        stream {
          hold_headers 15s
          late_comment ": provider=" + served.provider.name
          after_commit null
        }"#,
    );
    assert_eq!(file.items.len(), 4);
    let Item::Timeouts(timeouts) = &file.items[2] else {
        panic!()
    };
    assert_eq!(timeouts.timeouts[1].kind, TimeoutKind::Idle);
    let Item::Stream(stream) = &file.items[3] else {
        panic!()
    };
    assert!(matches!(
        stream.statements[2],
        StreamStmt::AfterCommit { .. }
    ));
}

#[test]
fn errors_headers_and_listing() {
    let file = parse_clean(
        r#"errors {
          wrong_endpoint = 400, "the model belongs to another endpoint"
          overloaded = if request.wire == "anthropic" then 529 else 503, "overloaded",
            retry_after coalesce(upstream.retry_after, 10s), type "overloaded_error",
            should_retry false
        }
        headers {
          "x-provider" = served.provider.name
        }
        listing {
          "owned_by" = if credential.owned then "personal" else "platform"
        }"#,
    );
    let Item::Errors(errors) = &file.items[0] else {
        panic!()
    };
    assert_eq!(errors.errors.len(), 2);
    assert!(errors.errors[1].retry_after.is_some());
    assert!(errors.errors[1].error_type.is_some());
    assert!(errors.errors[1].should_retry.is_some());
    assert!(errors.errors[0].should_retry.is_none());
    let Item::Headers(headers) = &file.items[1] else {
        panic!()
    };
    assert_eq!(headers.fields[0].name.value, "x-provider");
    assert!(matches!(file.items[2], Item::Listing(_)));
}

#[test]
fn literals() {
    assert_eq!(
        expr("10s").kind,
        ExprKind::Literal(Literal::Duration(10_000))
    );
    assert_eq!(
        expr("1.5s").kind,
        ExprKind::Literal(Literal::Duration(1_500))
    );
    assert_eq!(
        expr("250ms").kind,
        ExprKind::Literal(Literal::Duration(250))
    );
    assert_eq!(
        expr("5m").kind,
        ExprKind::Literal(Literal::Duration(300_000))
    );
    assert_eq!(
        expr("2h").kind,
        ExprKind::Literal(Literal::Duration(7_200_000))
    );
    assert_eq!(
        expr("1d").kind,
        ExprKind::Literal(Literal::Duration(86_400_000))
    );
    assert_eq!(expr("10%").kind, ExprKind::Literal(Literal::Percent(0.1)));
    assert_eq!(expr("3").kind, ExprKind::Literal(Literal::Number(3.0)));
    assert_eq!(
        expr("\"a\\\"b\"").kind,
        ExprKind::Literal(Literal::String("a\"b".into()))
    );
    assert_eq!(expr("true").kind, ExprKind::Literal(Literal::Bool(true)));
    assert_eq!(expr("null").kind, ExprKind::Literal(Literal::Null));
}

#[test]
fn bad_literals_are_reported() {
    let id = SourceMap::new().add("e", "");
    let (_, diagnostics) = parse_expression(id, "1.0005s");
    assert_eq!(diagnostics[0].code, codes::BAD_LITERAL);
    let (_, diagnostics) = parse_expression(id, "400d");
    assert_eq!(diagnostics[0].code, codes::BAD_LITERAL);
}

#[test]
fn precedence_follows_the_documented_table() {
    // `not` binds looser than comparison, `and` tighter than `or`, `implies` loosest.
    assert_eq!(
        expr("not a == b").kind,
        ExprKind::Unary(
            UnaryOp::Not,
            Box::new(Expr {
                kind: bin(BinaryOp::Eq, path("a"), path("b")),
                span: Span::default()
            })
        )
    );
    assert_eq!(
        expr("a or b and c").kind,
        bin(
            BinaryOp::Or,
            path("a"),
            Expr {
                kind: bin(BinaryOp::And, path("b"), path("c")),
                span: Span::default()
            }
        )
    );
    assert_eq!(
        expr("a implies b or c").kind,
        bin(
            BinaryOp::Implies,
            path("a"),
            Expr {
                kind: bin(BinaryOp::Or, path("b"), path("c")),
                span: Span::default()
            }
        )
    );
    assert_eq!(
        expr("3 * a + b").kind,
        bin(
            BinaryOp::Add,
            Expr {
                kind: bin(BinaryOp::Mul, expr("3"), path("a")),
                span: Span::default()
            },
            path("b")
        )
    );
    assert_eq!(
        expr("x not in l").kind,
        bin(BinaryOp::NotIn, path("x"), path("l"))
    );
    // Like every operator, across lines and comments.
    for split in ["x not\n  in l", "x not  # unless listed\n  in l"] {
        assert_eq!(
            expr(split).kind,
            bin(BinaryOp::NotIn, path("x"), path("l")),
            "{split}"
        );
    }
    assert_eq!(
        expr("-a * b").kind,
        bin(
            BinaryOp::Mul,
            Expr {
                kind: ExprKind::Unary(UnaryOp::Negate, Box::new(path("a"))),
                span: Span::default()
            },
            path("b")
        )
    );
}

#[test]
fn calls_aggregates_lists_objects_and_conditionals() {
    assert!(
        matches!(expr("min(a, b, 3)").kind, ExprKind::Call(ref name, ref args) if name.name == "min" && args.len() == 3)
    );
    let ExprKind::Aggregate {
        function, filter, ..
    } = expr("min_of(cost where route.tier == \"private\")").kind
    else {
        panic!()
    };
    assert_eq!(function, Aggregate::MinOf);
    assert!(filter.is_some());
    assert!(matches!(expr("[1, 2, 3]").kind, ExprKind::List(ref items) if items.len() == 3));
    assert!(
        matches!(expr("{ only: [it], allow_fallbacks: false }").kind, ExprKind::Object(ref fields) if fields.len() == 2)
    );
    assert!(matches!(expr("if a then 1 else 2").kind, ExprKind::If(..)));
    assert_eq!(
        expr("input.provider.order").path_text().unwrap(),
        "input.provider.order"
    );
}

#[test]
fn keywords_need_a_word_boundary() {
    // `byok` is a name, not `by` followed by `ok`.
    let parsed = parse_text("order {\n  byok\n}\n");
    assert_eq!(parsed.diagnostics.len(), 1);
    assert_eq!(parsed.diagnostics[0].code, codes::SYNTAX);
}

#[test]
fn spans_point_at_source_text() {
    let text = "let weighted = 3 * route.price.input";
    let Item::Let(decl) = only_item(text) else {
        panic!()
    };
    assert_eq!(&text[decl.name.span.range()], "weighted");
    assert_eq!(&text[decl.value.span.range()], "3 * route.price.input");
}

#[test]
fn a_bracketed_expression_spans_its_brackets() {
    // (text, the side of the product that is bracketed)
    for (text, left) in [
        ("let w = (1 + provider.priority) * 3", true),
        ("let w = 3 * (1 + provider.priority)", false),
    ] {
        let Item::Let(decl) = only_item(text) else {
            panic!("{text}")
        };
        assert_eq!(&text[decl.value.span.range()], &text["let w = ".len()..]);
        let ExprKind::Binary(_, lhs, rhs) = &decl.value.kind else {
            panic!("{text}")
        };
        let side = if left { lhs } else { rhs };
        assert_eq!(&text[side.span.range()], "(1 + provider.priority)");
    }
    let text = "let w = ((a))";
    let Item::Let(decl) = only_item(text) else {
        panic!()
    };
    assert_eq!(&text[decl.value.span.range()], "((a))");
}

#[test]
fn differently_formatted_policies_compare_equal() {
    let a = parse_clean("order { by a desc by b }");
    let b = parse_clean("order {\n    by a   desc # comment\n    by b\n}\n");
    assert_eq!(a, b);
}

#[test]
fn every_mistake_in_a_file_is_reported() {
    let parsed = parse_text(
        "policy p {\n  catalog \"c.yaml\"\n}\neligibility {\n  require x == else e1\n  require y else e2\n}\norder {\n  by a desk\n  by b\n}\nlet z = 3 +\nerrors {\n  e1 = 400, \"one\"\n  e2 = 400 \"two\"\n}\n",
    );
    let lines: Vec<usize> = parsed
        .diagnostics
        .iter()
        .map(|d| {
            let span = d.primary.as_ref().unwrap().span;
            parsed_line("policy p {\n  catalog \"c.yaml\"\n}\neligibility {\n  require x == else e1\n  require y else e2\n}\norder {\n  by a desk\n  by b\n}\nlet z = 3 +\nerrors {\n  e1 = 400, \"one\"\n  e2 = 400 \"two\"\n}\n", span.start)
        })
        .collect();
    // `let z = 3 +` is reported where its line ends, not at the next line's
    // `errors`, where its text ends.
    assert_eq!(lines, [5, 9, 12, 15], "{:#?}", parsed.diagnostics);
    // Statements that parsed are kept for the checker.
    let kept: Vec<&str> = parsed.file.items.iter().map(Item::keyword).collect();
    assert_eq!(kept, ["policy", "eligibility", "order", "errors"]);
    let Item::Eligibility(block) = &parsed.file.items[1] else {
        panic!()
    };
    assert_eq!(block.steps.len(), 1);
    assert_eq!(parsed.broken_names, ["z", "e2"]);
}

fn parsed_line(text: &str, offset: usize) -> usize {
    text[..offset].matches('\n').count() + 1
}

#[test]
fn unclosed_blocks_and_strings_are_reported_once() {
    let parsed = parse_text("order {\n  by a\nlet b = \"x\n");
    let codes: Vec<&str> = parsed.diagnostics.iter().map(|d| d.code.id).collect();
    assert_eq!(codes, ["E0103", "E0102"], "{:#?}", parsed.diagnostics);
}

#[test]
fn deep_nesting_is_refused_before_parsing() {
    let text = format!("let a = {}1{}", "(".repeat(200), ")".repeat(200));
    let parsed = parse_text(&text);
    assert_eq!(parsed.diagnostics[0].code, codes::TOO_DEEP);
    let text = format!("let a = {}x", "not ".repeat(400));
    let parsed = parse_text(&text);
    assert_eq!(parsed.diagnostics[0].code, codes::TOO_DEEP);
}

#[test]
fn syntax_errors_say_what_was_expected() {
    let parsed = parse_text("eligibility {\n  require a els e\n}\n");
    let message = &parsed.diagnostics[0].message;
    assert!(message.contains("`else`"), "{message}");
    assert!(message.contains("found `els`"), "{message}");
}

#[test]
fn bracket_problems_past_the_shown_ones_still_hold_back_their_syntax_errors() {
    // Thirty items, each with a stray `)`: twenty bracket errors and a
    // count are shown, and no item gets a syntax error on top.
    let text: String = (0..30).map(|n| format!("let stray{n} = 1)\n")).collect();
    let parsed = parse_text(&text);
    let codes: Vec<&str> = parsed.diagnostics.iter().map(|d| d.code.id).collect();
    assert_eq!(codes.len(), 21, "{codes:?}");
    assert!(codes.iter().all(|code| *code == "E0103"), "{codes:?}");
}

/// The message and `line:column` of each syntax error in `text`.
fn syntax_errors(text: &str) -> Vec<(String, usize, usize)> {
    let mut sources = SourceMap::new();
    let id = sources.add("test.policy", text);
    let file = sources.file(id).unwrap();
    parse(id, text)
        .diagnostics
        .iter()
        .map(|d| {
            let (line, column) = file.line_col(d.primary.as_ref().unwrap().span.start);
            (d.message.clone(), line, column)
        })
        .collect()
}

#[test]
fn a_statement_cut_short_is_shown_where_its_code_ends() {
    let expected = |line, column| {
        vec![(
            String::from(
                "expected `[`, `if`, `{`, a name, a number or a string, found end of line",
            ),
            line,
            column,
        )]
    };
    // Comments after it, on its line or the next, are not part of it.
    assert_eq!(
        syntax_errors("let z = 3 +\n# why z\n\nlet y = 1\n"),
        expected(1, 12)
    );
    assert_eq!(
        syntax_errors("let z = 3 + # why \"z\n\nlet y = 1\n"),
        expected(1, 12)
    );
    assert_eq!(
        syntax_errors("let z = 3 +\r\n# why\r\nlet y = 1\r\n"),
        expected(1, 12)
    );
    // At the file's end too, where what it found is the end of the file.
    assert_eq!(
        syntax_errors("let y = 1\nlet z = 3 + # c\n# more\n"),
        [(
            String::from(
                "expected `[`, `if`, `{`, a name, a number or a string, found end of file"
            ),
            2,
            12
        )]
    );
}

#[test]
fn a_header_cut_short_names_the_brace_that_follows() {
    assert_eq!(
        syntax_errors("policy {\n  catalog \"c.yaml\"\n}\n"),
        [(String::from("expected a name, found `{`"), 1, 8)]
    );
}
