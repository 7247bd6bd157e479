//! The messages and method paths of `crates/fanout-lab/src/scenarios/grpc-aggregate.proto`
//! (package `lab.v1`), written by hand with prost derives instead of generated: same field
//! numbers, same types, so the bytes on the wire are what `protoc`-generated code would send.

/// `/lab.v1.Aggregator/GetPage` — the one method this baseline serves.
pub const GET_PAGE: &str = "/lab.v1.Aggregator/GetPage";
/// `/lab.v1.Users/GetUser` — called with `UserRequest { id: user_id }`.
pub const GET_USER: &str = "/lab.v1.Users/GetUser";
/// `/lab.v1.Orders/ListOrders` — called with `OrdersRequest { user_id, limit: 3 }`.
pub const LIST_ORDERS: &str = "/lab.v1.Orders/ListOrders";
/// `/lab.v1.Recs/GetRecs` — called with `RecsRequest { user_id }`.
pub const GET_RECS: &str = "/lab.v1.Recs/GetRecs";

/// `message PageRequest { string user_id = 1; }`
#[derive(Clone, PartialEq, prost::Message)]
pub struct PageRequest {
    /// `string user_id = 1;`
    #[prost(string, tag = "1")]
    pub user_id: String,
}

/// `message UserRequest { string id = 1; }`
#[derive(Clone, PartialEq, prost::Message)]
pub struct UserRequest {
    /// `string id = 1;`
    #[prost(string, tag = "1")]
    pub id: String,
}

/// `message User { string id = 1; string name = 2; string email = 3; int32 level = 4; }`
#[derive(Clone, PartialEq, prost::Message)]
pub struct User {
    /// `string id = 1;`
    #[prost(string, tag = "1")]
    pub id: String,
    /// `string name = 2;`
    #[prost(string, tag = "2")]
    pub name: String,
    /// `string email = 3;`
    #[prost(string, tag = "3")]
    pub email: String,
    /// `int32 level = 4;`
    #[prost(int32, tag = "4")]
    pub level: i32,
}

/// `message OrdersRequest { string user_id = 1; int32 limit = 2; }`
#[derive(Clone, PartialEq, prost::Message)]
pub struct OrdersRequest {
    /// `string user_id = 1;`
    #[prost(string, tag = "1")]
    pub user_id: String,
    /// `int32 limit = 2;`
    #[prost(int32, tag = "2")]
    pub limit: i32,
}

/// `message Order { string id = 1; int64 amount_cents = 2; string status = 3; }`
#[derive(Clone, PartialEq, prost::Message)]
pub struct Order {
    /// `string id = 1;`
    #[prost(string, tag = "1")]
    pub id: String,
    /// `int64 amount_cents = 2;`
    #[prost(int64, tag = "2")]
    pub amount_cents: i64,
    /// `string status = 3;`
    #[prost(string, tag = "3")]
    pub status: String,
}

/// `message OrderList { repeated Order orders = 1; }`
#[derive(Clone, PartialEq, prost::Message)]
pub struct OrderList {
    /// `repeated Order orders = 1;`
    #[prost(message, repeated, tag = "1")]
    pub orders: Vec<Order>,
}

/// `message RecsRequest { string user_id = 1; }`
#[derive(Clone, PartialEq, prost::Message)]
pub struct RecsRequest {
    /// `string user_id = 1;`
    #[prost(string, tag = "1")]
    pub user_id: String,
}

/// `message Rec { string sku = 1; double score = 2; }`
#[derive(Clone, PartialEq, prost::Message)]
pub struct Rec {
    /// `string sku = 1;`
    #[prost(string, tag = "1")]
    pub sku: String,
    /// `double score = 2;`
    #[prost(double, tag = "2")]
    pub score: f64,
}

/// `message RecList { repeated Rec items = 1; }`
#[derive(Clone, PartialEq, prost::Message)]
pub struct RecList {
    /// `repeated Rec items = 1;`
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<Rec>,
}

/// `message Page { User user = 1; repeated Order orders = 2; repeated Rec recs = 3; }`
#[derive(Clone, PartialEq, prost::Message)]
pub struct Page {
    /// `User user = 1;` (a message field: absent on the wire is `None`)
    #[prost(message, optional, tag = "1")]
    pub user: Option<User>,
    /// `repeated Order orders = 2;`
    #[prost(message, repeated, tag = "2")]
    pub orders: Vec<Order>,
    /// `repeated Rec recs = 3;`
    #[prost(message, repeated, tag = "3")]
    pub recs: Vec<Rec>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// Hand-encoded bytes (protobuf wire format) decode into the derived structs, field by field.
    #[test]
    fn wire_format_matches_the_proto() {
        // User { id: "7" (1, len), name: "x" (2, len), email: "e" (3, len), level: 3 (4, varint) }
        let user = [0x0a, 1, b'7', 0x12, 1, b'x', 0x1a, 1, b'e', 0x20, 3];
        let decoded = User::decode(&user[..]).unwrap();
        assert_eq!(
            decoded,
            User {
                id: "7".into(),
                name: "x".into(),
                email: "e".into(),
                level: 3
            }
        );
        assert_eq!(decoded.encode_to_vec(), user);

        // OrdersRequest { user_id: "7" (1, len), limit: 3 (2, varint) }
        let req = OrdersRequest {
            user_id: "7".into(),
            limit: 3,
        };
        assert_eq!(req.encode_to_vec(), [0x0a, 1, b'7', 0x10, 3]);

        // Order { id: "o" (1), amount_cents: 1000 (2, varint e8 07), status: "p" (3) }
        let order = Order {
            id: "o".into(),
            amount_cents: 1000,
            status: "p".into(),
        };
        assert_eq!(
            order.encode_to_vec(),
            [0x0a, 1, b'o', 0x10, 0xe8, 0x07, 0x1a, 1, b'p']
        );

        // Rec { sku: "s" (1), score: 0.5 (2, fixed64) }
        let mut rec = vec![0x0a, 1, b's', 0x11];
        rec.extend_from_slice(&0.5f64.to_le_bytes());
        assert_eq!(
            Rec::decode(&rec[..]).unwrap(),
            Rec {
                sku: "s".into(),
                score: 0.5
            }
        );

        // Page { user (1, len), orders (2, len) ×1, recs (3, len) ×1 }
        let page = Page {
            user: Some(decoded),
            orders: vec![order.clone()],
            recs: vec![Rec {
                sku: "s".into(),
                score: 0.5,
            }],
        };
        let bytes = page.encode_to_vec();
        assert_eq!(bytes[0], 0x0a);
        assert_eq!(bytes[1] as usize, user.len());
        assert_eq!(bytes[2 + user.len()], 0x12);
        assert_eq!(Page::decode(&bytes[..]).unwrap(), page);
        // OrderList's `orders = 1` and RecList's `items = 1` are Page's 2 and 3 renumbered.
        let list = OrderList {
            orders: vec![order],
        };
        assert_eq!(list.encode_to_vec()[0], 0x0a);
    }
}
