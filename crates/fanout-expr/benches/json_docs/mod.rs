//! The JSON documents the `expr` bench and the `json_cost` example measure (one definition for
//! both: the example's instruction counts and the bench's times are of the same input).

/// The 8 KiB document: 100 items with ids, names, `x.5` prices and tags.
pub fn plain() -> String {
    let items: Vec<String> = (0..100)
        .map(|i| {
            format!(
                r#"{{"id":{i},"name":"item {i}","price":{}.5,"tags":["a","b"]}}"#,
                i * 3
            )
        })
        .collect();
    format!(
        r#"{{"total":100,"items":[{}],"meta":{{"page":{{"n":1}}}}}}"#,
        items.join(",")
    )
}

/// 100 objects with 8 numbers each: integers, an id above 2^63, decimals that a float prints
/// back as written, and literals that only their text keeps (`1.50`, 20 digits, an exponent).
pub fn numbers() -> String {
    let items: Vec<String> = (0..100)
        .map(|i| {
            format!(
                r#"{{"id":{i},"big":{},"price":{}.25,"amount":"x","rate":0.000{},"lat":55.75{},"cents":{}.50,"long":0.10000000000000000{},"e":1e{}}}"#,
                18446744073709551515u64 + i,
                i * 7,
                i + 1,
                i + 10,
                i,
                i + 10,
                i % 300
            )
        })
        .collect();
    format!("[{}]", items.join(","))
}
