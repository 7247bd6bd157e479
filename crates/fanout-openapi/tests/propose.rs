//! `propose` (the draft answer schema of `fanout test --propose-schemas`), data-driven: each case
//! of `propose.yaml` is answers and the schema they must give; every answer must also validate
//! against the schema drafted from it.

use serde_json::Value;

#[test]
fn answers_give_the_expected_draft_schema() {
    let text = include_str!("propose.yaml");
    let cases: Vec<Value> = serde_saphyr::from_str(text).unwrap();
    assert!(cases.len() >= 10);
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let answers = case["answers"].as_array().unwrap();
        let p = fanout_openapi::propose(answers, 32);
        assert_eq!(p.answers, answers.len(), "{name}");
        assert!(!p.truncated, "{name}");
        let mut got = p.schema.clone();
        let dialect = got.as_object_mut().unwrap().remove("$schema");
        assert_eq!(
            dialect.as_ref().and_then(Value::as_str),
            Some("https://json-schema.org/draft/2020-12/schema"),
            "{name}"
        );
        assert_eq!(got, case["schema"], "{name}: got {got:#}");
        let v = jsonschema::draft202012::new(&p.schema).unwrap();
        for a in answers {
            assert!(v.is_valid(a), "{name}: {a} does not match its own draft");
        }
    }
}
