//! Running one statement on a connection: prepare once per connection, bind, read the rows into
//! the answer (values while small, JSON text past `VALUE_ROWS_MAX_BYTES`) against the caps.

use super::*;

/// A statement prepared on a connection, with the object its rows are made from: the columns'
/// names as keys (built once), each row a clone whose values are set by position — no key is
/// hashed or allocated per row. Shared: a call takes a reference count.
pub(super) type Prepared = Arc<PreparedStatement>;

pub(super) struct PreparedStatement {
    pub(super) stmt: Statement,
    pub(super) row: RowShape,
}

/// How a row becomes an object.
pub(super) enum RowShape {
    /// `{name: null, ...}` in column order (the names are distinct): each row is a clone with its
    /// values set by position.
    Template(Map),
    /// The columns' names as values (two columns share a name): each row is built by inserting,
    /// so the later column wins, as in an object built key by key.
    Names(Box<[Val]>),
}

pub(super) fn prepared(stmt: Statement) -> Prepared {
    let names: Box<[Val]> = stmt
        .columns()
        .iter()
        .map(|c| Val::utf8_str(bytes::Bytes::copy_from_slice(c.name().as_bytes())))
        .collect();
    let mut template = Map::with_capacity_and_hasher(names.len(), Default::default());
    for n in names.iter() {
        template.insert(n.clone(), Val::Null);
    }
    let row = if template.len() == names.len() {
        RowShape::Template(template)
    } else {
        RowShape::Names(names)
    };
    Arc::new(PreparedStatement { stmt, row })
}

/// `{"rows": null, "rows_affected": null}`: every answer is a clone with the two values set.
pub(super) static ANSWER: std::sync::LazyLock<Map> = std::sync::LazyLock::new(|| {
    let mut m = Map::with_capacity_and_hasher(2, Default::default());
    m.insert(static_str_val("rows"), Val::Null);
    m.insert(static_str_val("rows_affected"), Val::Null);
    m
});

/// A column value in its binary wire form (`None`: NULL), for [`types::write_value`].
pub(super) struct Raw<'a>(Option<&'a [u8]>);

impl<'a> FromSql<'a> for Raw<'a> {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Raw(Some(raw)))
    }
    fn from_sql_null(_: &Type) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Raw(None))
    }
    fn accepts(_: &Type) -> bool {
        true
    }
}

/// Why a statement did not run to its answer on a connection.
pub(super) enum ExecError {
    /// The database answered an error (the connection is fine).
    Db(tokio_postgres::Error),
    /// A parameter does not fit its type (`param`: 1-based; 0 = their number): nothing was sent.
    Param(usize, String),
    /// The answer is larger than `max_response_bytes`.
    TooLarge,
    /// The memory budget (of this many bytes) has no room for the answer.
    Memory(usize),
    /// A column value could not be read (its type changed since the statement was checked):
    /// the rest of the rows are still coming.
    Column(String),
    /// The connection broke.
    Broken(tokio_postgres::Error),
}

impl From<tokio_postgres::Error> for ExecError {
    fn from(e: tokio_postgres::Error) -> Self {
        if e.as_db_error().is_some() {
            ExecError::Db(e)
        } else {
            ExecError::Broken(e)
        }
    }
}

pub(super) fn response(status: StatusCode, body: impl Into<Bytes>) -> CallResponse {
    CallResponse {
        status,
        body: body.into(),
        value: None,
        parsed: None,
    }
}

/// Prepare (once per connection), bind, run, and build the answer (`[...]`, or
/// `{rows: [...], rows_affected}`) as a value (the step takes it without a JSON round trip).
pub(super) async fn execute(
    conn: &mut Conn,
    call: &SqlCall,
    max_bytes: usize,
    counters: &PoolCounters,
    memory: Option<&Arc<fanout_protocol::bodies::BodyGate>>,
) -> Result<Answer, ExecError> {
    let prep = match conn.prepared.get(&call.statement) {
        Some(s) => s.clone(),
        None => {
            // Boxed: rare (statements are prepared when a connection opens), and large.
            let s = prepared(Box::pin(conn.client.prepare(&call.statement)).await?);
            conn.prepared.insert(call.statement.clone(), s.clone());
            s
        }
    };
    let stmt = &prep.stmt;
    if stmt.params().len() != call.params.len() {
        return Err(ExecError::Param(
            0,
            format!(
                "the statement takes {} parameters, the step passes {}",
                stmt.params().len(),
                call.params.len()
            ),
        ));
    }
    let mut params: smallvec::SmallVec<[types::Param; 4]> =
        smallvec::SmallVec::with_capacity(call.params.len());
    for (i, (v, ty)) in call.params.iter().zip(stmt.params()).enumerate() {
        params.push(types::param(v, ty).map_err(|p| ExecError::Param(i + 1, p))?);
    }
    counters.statements.fetch_add(1, Ordering::Relaxed);
    let rows = conn.client.query_raw(stmt, params.iter()).await?;
    pin_mut!(rows);
    let cols = stmt.columns();
    // A json/jsonb column sits three levels down in the answer `{rows: [{col: …}]}` (two in
    // the rows alone; the same limit for both, as the step's answer is the same).
    let depth = call.max_depth.saturating_sub(3);
    let mut acc = Rows::new(call, memory);
    let mut scratch = Vec::new();
    while let Some(row) = rows.next().await {
        // Rows already buffered come back without the stream ever waiting: a long answer would
        // hold this worker for as long as it takes to convert. Tokio's cooperative budget makes
        // this task yield every so many rows, so the worker's other tasks get their turn.
        tokio::task::consume_budget().await;
        let row = row?;
        // The row's size, counted as its JSON text would be (names, values' wire bytes, quotes
        // and separators) before any value is converted: a row that would pass the cap is
        // refused without a copy of its values being made.
        let mut row_size = 2usize;
        for (i, c) in cols.iter().enumerate() {
            let raw: Raw<'_> = row.try_get(i)?;
            row_size = row_size.saturating_add(c.name().len() + 6 + raw.0.map_or(4, <[u8]>::len));
        }
        if acc.size.saturating_add(row_size) > max_bytes {
            return Err(ExecError::TooLarge);
        }
        let mut obj = match &prep.row {
            RowShape::Template(template) => template.clone(),
            RowShape::Names(_) => Map::with_capacity_and_hasher(cols.len(), Default::default()),
        };
        for (i, c) in cols.iter().enumerate() {
            let raw: Raw<'_> = row.try_get(i)?;
            let v = types::to_val(c.type_(), raw.0, depth, &mut scratch)
                .map_err(|p| ExecError::Column(format!("column `{}`: {p}", c.name())))?;
            match &prep.row {
                RowShape::Template(_) => {
                    if let Some((_, slot)) = obj.get_index_mut(i) {
                        *slot = v;
                    }
                }
                RowShape::Names(names) => {
                    if let Some(name) = names.get(i) {
                        obj.insert(name.clone(), v);
                    }
                }
            }
        }
        acc.push(Val::obj(obj), row_size, max_bytes)?;
    }
    counters.rows.fetch_add(acc.n as u64, Ordering::Relaxed);
    let affected = rows.rows_affected();
    Ok(acc.finish(affected))
}

/// Rows kept as values while the answer's JSON would be at most this many bytes (every answer
/// of a `one`/`optional` step or a short list: no JSON text is written and parsed again); past
/// it the rows are written as JSON text as they arrive — a row as a value costs 10–30 times
/// its JSON size (a map, its table, the `Arc`s, a number or string each), which is what made a
/// statement stopped at a 16 MiB cap hold 400 MiB.
pub(super) const VALUE_ROWS_MAX_BYTES: usize = 64 << 10;

/// A statement's answer as it was built.
pub(super) enum Answer {
    /// Built as a value (small answers).
    Value(Val),
    /// Written as JSON text (large answers); the step parses it like an HTTP backend's answer
    /// (a large one on the compute pool). Holds its share of the memory budget until dropped.
    Text(Bytes),
}

/// The rows of an answer as they arrive: values while small, then JSON text.
pub(super) struct Rows<'a> {
    /// Only the rows (`[...]`), not `{rows, rows_affected}`.
    pub(super) rows_only: bool,
    /// The one row alone while it is the only one ([`SqlCall::single_row`]).
    pub(super) single: bool,
    pub(super) first: Option<Val>,
    pub(super) vals: Vec<Val>,
    /// Once the answer passed [`VALUE_ROWS_MAX_BYTES`]: its JSON text so far (without the
    /// closing part). For a single row, its first byte is a space, made `[` at the second row.
    pub(super) text: Option<Text>,
    /// Rows so far.
    pub(super) n: usize,
    /// The answer's JSON size so far: estimated from the wire while values, exact once text.
    pub(super) size: usize,
    pub(super) memory: Option<&'a Arc<fanout_protocol::bodies::BodyGate>>,
    /// The share of the memory budget taken (`size`, or the text's capacity).
    pub(super) reserved: Option<fanout_protocol::bodies::Reservation>,
}

impl<'a> Rows<'a> {
    pub(super) fn new(
        call: &SqlCall,
        memory: Option<&'a Arc<fanout_protocol::bodies::BodyGate>>,
    ) -> Self {
        Rows {
            rows_only: call.rows_only,
            single: call.rows_only && call.single_row,
            first: None,
            vals: Vec::new(),
            text: None,
            n: 0,
            size: 32,
            memory,
            reserved: None,
        }
    }

    /// Add a row (`estimate`: its JSON size from the wire), refusing the answer past `max_bytes`
    /// or when the memory budget has no room for it.
    pub(super) fn push(
        &mut self,
        row: Val,
        estimate: usize,
        max_bytes: usize,
    ) -> Result<(), ExecError> {
        self.n += 1;
        match &mut self.text {
            Some(t) => {
                Self::write_row(t, &row, estimate, self.n, self.single);
                drop(row);
                self.size = t.len();
            }
            None => {
                self.size = self.size.saturating_add(estimate);
                if self.single && self.first.is_none() && self.vals.is_empty() {
                    self.first = Some(row);
                } else {
                    self.vals.extend(self.first.take());
                    self.vals.push(row);
                }
                if self.size > VALUE_ROWS_MAX_BYTES {
                    self.spill();
                }
            }
        }
        if self.size > max_bytes {
            return Err(ExecError::TooLarge);
        }
        self.reserve()
    }

    /// Append row number `n` (1-based) to the text.
    pub(super) fn write_row(t: &mut Text, row: &Val, estimate: usize, n: usize, single: bool) {
        if single && n == 2 {
            // A second row of a single-row call: the answer is a list after all.
            if let Some(b) = t.first_byte() {
                *b = b'[';
            }
        }
        // The estimate is from the wire: a number's text may be longer (an int4 is 4 bytes
        // there, up to 11 here), a string's escapes too.
        let buf = t.buf(estimate.saturating_mul(2).saturating_add(64));
        if n > 1 {
            buf.push(b',');
        }
        fanout_expr::json::write(row, buf);
    }

    /// Turn the values so far into JSON text.
    pub(super) fn spill(&mut self) {
        let mut t = Text::default();
        t.buf(16)
            .extend_from_slice(match (self.rows_only, self.single) {
                (false, _) => br#"{"rows":["#.as_slice(),
                (true, true) => b" ",
                (true, false) => b"[",
            });
        let vals = std::mem::take(&mut self.vals);
        for (i, row) in self.first.take().iter().chain(vals.iter()).enumerate() {
            Self::write_row(&mut t, row, 4096, i + 1, self.single);
        }
        self.size = t.len();
        self.text = Some(t);
    }

    /// Grow the reservation to what the answer holds now.
    pub(super) fn reserve(&mut self) -> Result<(), ExecError> {
        let Some(gate) = self.memory else {
            return Ok(());
        };
        let holds = self.text.as_ref().map_or(self.size, Text::capacity);
        let r = self.reserved.get_or_insert_with(|| gate.reservation());
        if let Some(more) = holds.checked_sub(r.bytes()).filter(|&m| m > 0) {
            r.grow(more).map_err(|_| ExecError::Memory(gate.budget()))?;
        }
        Ok(())
    }

    /// The answer: `[...]` (one row alone for a single-row call), or `{rows, rows_affected}`.
    pub(super) fn finish(mut self, affected: Option<u64>) -> Answer {
        if let Some(mut t) = self.text.take() {
            let end = t.buf(64);
            if !self.rows_only {
                end.extend_from_slice(br#"],"rows_affected":"#);
                end.extend_from_slice(affected.unwrap_or(0).to_string().as_bytes());
                end.push(b'}');
            } else if !(self.single && self.n == 1) {
                end.push(b']');
            }
            return Answer::Text(Bytes::from_owner(Held {
                text: t.into_vec(),
                _memory: self.reserved.take(),
            }));
        }
        if let Some(row) = self.first.take() {
            return Answer::Value(row);
        }
        let out = std::mem::take(&mut self.vals);
        if self.rows_only {
            return Answer::Value(Val::Arr(out.into()));
        }
        let mut answer = ANSWER.clone();
        if let Some((_, v)) = answer.get_index_mut(0) {
            *v = out.into_iter().collect();
        }
        if let Some((_, v)) = answer.get_index_mut(1) {
            *v = Val::from(usize::try_from(affected.unwrap_or(0)).unwrap_or(usize::MAX));
        }
        Answer::Value(Val::obj(answer))
    }
}

/// The chunks of an answer's JSON text.
pub(super) const TEXT_CHUNK: usize = 256 << 10;

/// An answer's JSON text as it is written, in chunks of about [`TEXT_CHUNK`] bytes: growing it
/// never copies what is written (one buffer would be copied at every doubling, and hold up to
/// twice the answer), so an answer refused at the cap has held about the cap. Made one buffer
/// once complete.
#[derive(Default)]
pub(super) struct Text {
    pub(super) full: Vec<Vec<u8>>,
    pub(super) cur: Vec<u8>,
    pub(super) full_len: usize,
    pub(super) full_cap: usize,
}

impl Text {
    /// The chunk to write the next `need` bytes into (a new one when the current one has not the
    /// room: a full chunk is never grown, which would double it).
    pub(super) fn buf(&mut self, need: usize) -> &mut Vec<u8> {
        if self.cur.capacity() - self.cur.len() < need {
            let size = need.max(TEXT_CHUNK);
            if self.cur.is_empty() {
                self.cur.reserve_exact(size);
            } else {
                let done = std::mem::replace(&mut self.cur, Vec::with_capacity(size));
                self.full_len += done.len();
                self.full_cap += done.capacity();
                self.full.push(done);
            }
        }
        &mut self.cur
    }

    pub(super) fn len(&self) -> usize {
        self.full_len + self.cur.len()
    }

    pub(super) fn capacity(&self) -> usize {
        self.full_cap + self.cur.capacity()
    }

    pub(super) fn first_byte(&mut self) -> Option<&mut u8> {
        match self.full.first_mut() {
            Some(c) => c.first_mut(),
            None => self.cur.first_mut(),
        }
    }

    pub(super) fn into_vec(self) -> Vec<u8> {
        if self.full.is_empty() {
            return self.cur;
        }
        let mut out = Vec::with_capacity(self.len());
        for c in self.full {
            out.extend_from_slice(&c);
        }
        out.extend_from_slice(&self.cur);
        out
    }
}

/// An answer's JSON text with its share of the memory budget, released when the text is
/// dropped (once the step has parsed it).
pub(super) struct Held {
    pub(super) text: Vec<u8>,
    pub(super) _memory: Option<fanout_protocol::bodies::Reservation>,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.text
    }
}
