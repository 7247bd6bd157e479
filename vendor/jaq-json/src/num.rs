//! Integer / decimal numbers.
use super::Rc;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::cmp::Ordering;
use core::fmt;
use core::hash::{Hash, Hasher};
use num_bigint::{BigInt, BigUint, Sign};
use num_traits::cast::ToPrimitive;

/// Integer / decimal number.
///
/// The speciality of this type is that numbers are distinguished into
/// integers and 64-bit floating-point numbers.
/// This allows using integers to index arrays,
/// while using floating-point numbers to do general math.
///
/// Operations on numbers follow a few principles:
/// * The sum, difference, product, and remainder of two integers is integer.
/// * Any other operation between two numbers yields a float.
#[derive(Clone, Debug)]
pub enum Num {
    /// Machine-size integer
    Int(isize),
    /// Arbitrarily large integer
    BigInt(Rc<BigInt>),
    /// Floating-point number
    Float(f64),
    /// Decimal number
    Dec(Rc<String>),
}

impl Num {
    /// Create a big integer.
    ///
    /// fanout: an integer of more than [`MAX_INT_BITS`] bits becomes a float
    /// (arithmetic on huge integers would take unbounded time and memory).
    pub fn big_int(i: BigInt) -> Self {
        if i.bits() > MAX_INT_BITS {
            Self::Float(i.to_f64().unwrap_or(f64::NAN))
        } else {
            Self::BigInt(i.into())
        }
    }

    pub(crate) fn from_str(s: &str) -> Self {
        // fanout: literals keep their text (see `from_literal`)
        Self::from_literal(s)
    }

    /// fanout: the number that a number literal (JSON or jq syntax) stands for, keeping the
    /// literal's exact text as long as nothing computes with it, like jq 1.7:
    ///
    /// - an integer that fits `isize` is an [`Self::Int`] (`-0` excepted);
    /// - a decimal `x.y` that the float printers (ryu, shortest round trip) print exactly as
    ///   written — at most 15 significant digits, no trailing zero, no exponent, at most 4
    ///   zeros after `0.` — is a [`Self::Float`] (no allocation; nothing is lost);
    /// - anything else (`18446744073709551615`, `1.50`, `1e400`, `1E-5`, `-0`,
    ///   `0.1000000000000000055511151231257827`) is a [`Self::Dec`] with the text as written:
    ///   it prints unchanged, compares exactly with other literals and integers, and
    ///   arithmetic on it uses floats;
    /// - a literal of more than [`MAX_NUM_DIGITS`] characters is a float (parsing, comparing
    ///   or converting it would take time and memory in proportion to its length).
    ///
    /// `s` should be a number in JSON syntax (a leading `+` is dropped); text that is not is
    /// kept as a [`Self::Dec`] too.
    pub fn from_literal(s: &str) -> Self {
        if s.len() > MAX_NUM_DIGITS {
            return Self::from_dec_str(s);
        }
        if let Some(rest) = s.strip_prefix('+') {
            return Self::from_literal(rest);
        }
        let (neg, digits) = match s.strip_prefix('-') {
            Some(d) => (true, d.as_bytes()),
            None => (false, s.as_bytes()),
        };
        let int_len = digits.iter().take_while(|c| c.is_ascii_digit()).count();
        if int_len == digits.len() && int_len > 0 && !(neg && digits.iter().all(|c| *c == b'0')) {
            if let Ok(i) = s.parse::<isize>() {
                return Self::Int(i);
            }
        } else if let Some(f) = plain_float(digits, int_len) {
            return Self::Float(if neg { -f } else { f });
        }
        Self::Dec(Rc::new(s.to_string()))
    }

    /// Convert from an integral type to a machine-sized or big integer.
    pub fn from_integral<T: Copy + TryInto<isize> + Into<BigInt>>(x: T) -> Self {
        x.try_into()
            .map_or_else(|_| Num::big_int(x.into()), Num::Int)
    }

    /// Try to parse an integer from a string with given radix.
    ///
    /// fanout: fails for more than [`MAX_NUM_DIGITS`] digits.
    pub fn from_str_radix(i: &str, radix: u32) -> Option<Self> {
        if i.len() > MAX_NUM_DIGITS {
            return None;
        }
        let int = || isize::from_str_radix(i, radix).ok().map(Num::Int);
        let big = || bigint_from_str_radix(i, radix).map(Self::big_int);
        int().or_else(big)
    }

    /// Try to parse a decimal string to a [`Self::Float`], else return NaN.
    pub fn from_dec_str(n: &str) -> Self {
        // TODO: changed to NaN!
        n.parse().map_or(Self::Float(f64::NAN), Self::Float)
    }

    pub(crate) fn is_int(&self) -> bool {
        matches!(self, Self::Int(_) | Self::BigInt(_))
    }

    /// If the value is a machine-sized integer, return it, else fail.
    pub fn as_isize(&self) -> Option<isize> {
        match self {
            Self::Int(i) => Some(*i),
            Self::BigInt(i) => i.to_isize(),
            _ => None,
        }
    }

    pub(crate) fn as_pos_usize(&self) -> Option<PosUsize> {
        match self {
            Self::Int(i) => Some(PosUsize(*i >= 0, i.unsigned_abs())),
            Self::BigInt(i) => i
                .magnitude()
                .to_usize()
                .map(|u| PosUsize(i.sign() != Sign::Minus, u)),
            _ => None,
        }
    }

    /// If the value is or can be converted to float, return it, else fail.
    pub(crate) fn as_f64(&self) -> f64 {
        match self {
            Self::Int(n) => *n as f64,
            Self::BigInt(n) => n.to_f64().unwrap(),
            Self::Float(n) => *n,
            // fanout: no panic on a text that is no number
            Self::Dec(n) => n.parse().unwrap_or(f64::NAN),
        }
    }

    pub(crate) fn length(&self) -> Self {
        match self {
            Self::Int(i) => Self::Int(i.abs()),
            Self::BigInt(i) => match i.sign() {
                Sign::Plus | Sign::NoSign => Self::BigInt(i.clone()),
                Sign::Minus => Self::BigInt(BigInt::from(i.magnitude().clone()).into()),
            },
            Self::Dec(n) => Self::from_dec_str(n).length(),
            Self::Float(f) => Self::Float(f.abs()),
        }
    }
}

/// fanout: the value of `digits` (a decimal `x.y` without sign, `x` its first `int_len`
/// bytes) if the float printers print that value exactly as `digits` (see
/// [`Num::from_literal`]); computed exactly (a mantissa below 2^53 divided by an exact power
/// of ten: one correctly rounded division).
fn plain_float(digits: &[u8], int_len: usize) -> Option<f64> {
    const POW10: [f64; 20] = [
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
        1e17, 1e18, 1e19,
    ];
    let (int, rest) = digits.split_at(int_len);
    let frac = rest.strip_prefix(b".")?;
    let ok = !int.is_empty()
        && (int.len() == 1 || int[0] != b'0')
        && frac.iter().all(u8::is_ascii_digit)
        && frac.last().is_some_and(|c| *c != b'0');
    if !ok {
        return None;
    }
    // significant digits; ryu writes `0.0000d…` with at most 4 zeros, `d…e-6` below
    let (sig, zeros) = if int == b"0" {
        let z = frac.iter().take_while(|c| **c == b'0').count();
        (frac.len() - z, z)
    } else {
        (int.len() + frac.len(), 0)
    };
    if sig > 15 || zeros > 4 {
        return None;
    }
    let m = int
        .iter()
        .chain(frac)
        .fold(0u64, |m, c| m * 10 + u64::from(c - b'0'));
    Some(m as f64 / POW10[frac.len()])
}

/// fanout: compare two numbers written in decimal (JSON number syntax, a leading `+`
/// allowed) exactly, without converting them; `None` if either is not such text.
/// Exponents beyond ±10^15 saturate (such numbers are beyond any float anyway).
pub(crate) fn dec_cmp(a: &str, b: &str) -> Option<Ordering> {
    let (a, b) = (DecParts::new(a)?, DecParts::new(b)?);
    let sign = |d: &DecParts| match (d.is_zero(), d.neg) {
        (true, _) => 0i8,
        (false, true) => -1,
        (false, false) => 1,
    };
    let (sa, sb) = (sign(&a), sign(&b));
    if sa != sb || sa == 0 {
        return Some(sa.cmp(&sb));
    }
    // same sign, both non-zero: 0.D × 10^E, compare E, then the digits
    let mag = a.exp.cmp(&b.exp).then_with(|| a.sig().cmp(b.sig()));
    Some(if sa < 0 { mag.reverse() } else { mag })
}

/// fanout: a decimal split into sign, digits and exponent: `±0.D × 10^exp` where `D` are the
/// digits of `int` and `frac` without leading and trailing zeros.
struct DecParts<'a> {
    neg: bool,
    int: &'a [u8],
    frac: &'a [u8],
    /// zeros to skip at the start of `int`+`frac`, and the count of significant digits
    lead: usize,
    len: usize,
    exp: i64,
}

impl<'a> DecParts<'a> {
    fn new(s: &'a str) -> Option<Self> {
        const SAT: i64 = 1_000_000_000_000_000;
        let s = s.as_bytes();
        let (neg, s) = match s.first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let digits = |s: &'a [u8]| {
            let n = s.iter().take_while(|c| c.is_ascii_digit()).count();
            s.split_at(n)
        };
        let (int, rest) = digits(s);
        let (frac, rest) = match rest.strip_prefix(b".") {
            Some(r) => digits(r),
            None => (&rest[..0], rest),
        };
        if int.is_empty() && frac.is_empty() {
            return None;
        }
        let mut exp: i64 = 0;
        if let Some(e) = rest.strip_prefix(b"e").or_else(|| rest.strip_prefix(b"E")) {
            let (eneg, e) = match e.first() {
                Some(b'-') => (true, &e[1..]),
                Some(b'+') => (false, &e[1..]),
                _ => (false, e),
            };
            let (ed, tail) = digits(e);
            if ed.is_empty() || !tail.is_empty() {
                return None;
            }
            for c in ed {
                exp = (exp * 10 + i64::from(c - b'0')).min(SAT);
            }
            if eneg {
                exp = -exp;
            }
        } else if !rest.is_empty() {
            return None;
        }
        let all = || int.iter().chain(frac);
        let n = int.len() + frac.len();
        let lead = all().take_while(|c| **c == b'0').count();
        let trail = if lead == n {
            0
        } else {
            frac.iter()
                .rev()
                .chain(int.iter().rev())
                .take_while(|c| **c == b'0')
                .count()
        };
        let len = n - lead - trail;
        // the text is below 1000 characters (`MAX_NUM_DIGITS`): no overflow
        let exp = exp + int.len() as i64 - lead as i64;
        Some(DecParts {
            neg,
            int,
            frac,
            lead,
            len,
            exp,
        })
    }

    fn is_zero(&self) -> bool {
        self.len == 0
    }

    fn sig(&self) -> impl Iterator<Item = &'a u8> {
        self.int
            .iter()
            .chain(self.frac)
            .skip(self.lead)
            .take(self.len)
    }
}

#[test]
fn literals_and_exact_comparison() {
    use Ordering::{Equal, Greater, Less};
    // fanout
    for (a, b, o) in [
        ("1", "1.0", Equal),
        ("1.50", "1.5", Equal),
        ("100", "1e2", Equal),
        ("100", "1E+2", Equal),
        ("0.001", "1e-3", Equal),
        ("-0", "0", Equal),
        ("0e5", "-0.000", Equal),
        ("18446744073709551615", "18446744073709551614", Greater),
        ("-18446744073709551615", "-18446744073709551614", Less),
        ("-1", "0", Less),
        ("0.1000000000000000055511151231257827", "0.1", Greater),
        ("99", "100", Less),
        ("0.99", "1", Less),
        ("1e400", "1e401", Less),
        ("-1e400", "-1e401", Greater),
        ("1e99999999999999999999", "1e99999999999999999998", Equal), // saturated
    ] {
        assert_eq!(dec_cmp(a, b), Some(o), "{a} {b}");
        assert_eq!(dec_cmp(b, a), Some(o.reverse()), "{b} {a}");
    }
    assert_eq!(dec_cmp("x", "1"), None);
    assert_eq!(dec_cmp("1e", "1"), None);
    let lit = |s| match Num::from_literal(s) {
        Num::Int(_) => "int",
        Num::Float(_) => "float",
        Num::Dec(_) => "dec",
        Num::BigInt(_) => "big",
    };
    for (s, kind) in [
        ("12", "int"),
        ("-0", "dec"),
        ("+7", "int"),
        ("9223372036854775808", "dec"),
        ("2.5", "float"),
        ("0.00001", "float"),
        ("0.000001", "dec"),
        ("123456789012345.6", "dec"),
        ("12345678901234.5", "float"),
        ("1.0", "dec"),
        ("1e5", "dec"),
        ("01.5", "dec"),
    ] {
        assert_eq!(lit(s), kind, "{s}");
    }
    assert_eq!(Num::from_literal("-2.5"), Num::Float(-2.5));
    assert!(matches!(Num::from_literal(&"9".repeat(2000)), Num::Float(f) if f.is_infinite()));
}

/// fanout: integers of more bits than this are converted to floats.
pub const MAX_INT_BITS: u64 = 4096;
/// fanout: numbers of more characters than this are parsed as floats.
pub const MAX_NUM_DIGITS: usize = 1000;

#[derive(Copy, Clone)]
pub(crate) struct PosUsize(pub(crate) bool, pub(crate) usize);

impl PosUsize {
    pub fn wrap(&self, len: usize) -> Option<usize> {
        self.0.then_some(self.1).or_else(|| len.checked_sub(self.1))
    }
}

#[test]
fn wrap_test() {
    let len = 4;
    let pos = |i| PosUsize(true, i);
    let neg = |i| PosUsize(false, i);
    assert_eq!(pos(0).wrap(len), Some(0));
    assert_eq!(pos(8).wrap(len), Some(8));
    assert_eq!(neg(1).wrap(len), Some(3));
    assert_eq!(neg(4).wrap(len), Some(0));
    assert_eq!(neg(8).wrap(len), None);
}

fn int_or_big<const N: usize>(
    i: Option<isize>,
    x: [isize; N],
    f: fn([BigInt; N]) -> BigInt,
) -> Num {
    i.map_or_else(|| Num::big_int(f(x.map(BigInt::from))), Num::Int)
}

// Do not use `BigInt::parse_bytes`, because it accepts arbitrary underscores between digits.
// https://github.com/rust-num/num-bigint/issues/340
fn bigint_from_str_radix(s: &str, radix: u32) -> Option<BigInt> {
    use num_bigint::Sign::{Minus, Plus};
    let f = |c, sign| s.strip_prefix(c).map(|s| (sign, s));
    let (sign, num) = f('-', Minus).or_else(|| f('+', Plus)).unwrap_or((Plus, s));
    biguint_from_str_radix(num, radix).map(|bu| BigInt::from_biguint(sign, bu))
}

fn biguint_from_str_radix(s: &str, radix: u32) -> Option<BigUint> {
    assert!((2..=36).contains(&radix));
    if s.is_empty() {
        return None;
    }

    // normalize all characters to plain digit values
    let digits = s.bytes().map(|b| {
        Some(match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'z' => b - b'a' + 10,
            b'A'..=b'Z' => b - b'A' + 10,
            _ => return None,
        })
        .filter(|d| *d < radix as u8)
    });
    BigUint::from_radix_be(&digits.collect::<Option<Vec<_>>>()?, radix)
}

impl core::ops::Add for Num {
    type Output = Num;
    fn add(self, rhs: Self) -> Self::Output {
        use num_bigint::BigInt;
        use Num::*;
        match (self, rhs) {
            (Int(x), Int(y)) => int_or_big(x.checked_add(y), [x, y], |[x, y]| x + y),
            (Int(i), BigInt(b)) | (BigInt(b), Int(i)) => Self::big_int(&BigInt::from(i) + &*b),
            (Int(i), Float(f)) | (Float(f), Int(i)) => Float(f + i as f64),
            (BigInt(x), BigInt(y)) => Self::big_int(&*x + &*y),
            (BigInt(i), Float(f)) | (Float(f), BigInt(i)) => Float(f + i.to_f64().unwrap()),
            (Float(x), Float(y)) => Float(x + y),
            (Dec(n), r) => Self::from_dec_str(&n) + r,
            (l, Dec(n)) => l + Self::from_dec_str(&n),
        }
    }
}

impl core::ops::Sub for Num {
    type Output = Self;
    fn sub(self, rhs: Self) -> Self::Output {
        use num_bigint::BigInt;
        use Num::*;
        match (self, rhs) {
            (Int(x), Int(y)) => int_or_big(x.checked_sub(y), [x, y], |[x, y]| x - y),
            (Int(i), BigInt(b)) => Self::big_int(&BigInt::from(i) - &*b),
            (BigInt(b), Int(i)) => Self::big_int(&*b - &BigInt::from(i)),
            (BigInt(x), BigInt(y)) => Self::big_int(&*x - &*y),
            (Float(f), Int(i)) => Float(f - i as f64),
            (Int(i), Float(f)) => Float(i as f64 - f),
            (Float(f), BigInt(i)) => Float(f - i.to_f64().unwrap()),
            (BigInt(i), Float(f)) => Float(i.to_f64().unwrap() - f),
            (Float(x), Float(y)) => Float(x - y),
            (Dec(n), r) => Self::from_dec_str(&n) - r,
            (l, Dec(n)) => l - Self::from_dec_str(&n),
        }
    }
}

impl core::ops::Mul for Num {
    type Output = Self;
    fn mul(self, rhs: Self) -> Self::Output {
        use num_bigint::BigInt;
        use Num::*;
        match (self, rhs) {
            (Int(x), Int(y)) => int_or_big(x.checked_mul(y), [x, y], |[x, y]| x * y),

            (Int(i), BigInt(b)) | (BigInt(b), Int(i)) => Self::big_int(&BigInt::from(i) * &*b),
            (BigInt(x), BigInt(y)) => Self::big_int(&*x * &*y),
            (BigInt(i), Float(f)) | (Float(f), BigInt(i)) => Float(f * i.to_f64().unwrap()),
            (Float(f), Int(i)) | (Int(i), Float(f)) => Float(f * i as f64),
            (Float(x), Float(y)) => Float(x * y),
            (Dec(n), r) => Self::from_dec_str(&n) * r,
            (l, Dec(n)) => l * Self::from_dec_str(&n),
        }
    }
}

impl core::ops::Div for Num {
    type Output = Self;
    fn div(self, rhs: Self) -> Self::Output {
        use Num::{BigInt, Dec, Float, Int};
        match (self, rhs) {
            (Int(l), r) => Float(l as f64) / r,
            (l, Int(r)) => l / Float(r as f64),
            (BigInt(l), r) => Float(l.to_f64().unwrap()) / r,
            (l, BigInt(r)) => l / Float(r.to_f64().unwrap()),
            (Float(x), Float(y)) => Float(x / y),
            (Dec(n), r) => Self::from_dec_str(&n) / r,
            (l, Dec(n)) => l / Self::from_dec_str(&n),
        }
    }
}

impl core::ops::Rem for Num {
    type Output = Self;
    fn rem(self, rhs: Self) -> Self::Output {
        use num_bigint::BigInt;
        use Num::*;
        match (self, rhs) {
            // `x.checked_rem(y)` is `None` only for:
            //
            // - `isize::MIN % -1`: The remainder is always 0.
            // - `x % 0`: This is guarded by `Val`.
            (Int(x), Int(y)) => Int(x.checked_rem(y).unwrap_or(0)),
            (BigInt(x), BigInt(y)) => Num::big_int(&*x % &*y),
            (Int(i), BigInt(b)) => Num::big_int(&BigInt::from(i) % &*b),
            (BigInt(b), Int(i)) => Num::big_int(&*b % &BigInt::from(i)),
            (Int(i), Float(f)) => Float(i as f64 % f),
            (Float(f), Int(i)) => Float(f % i as f64),
            (BigInt(i), Float(f)) => Float(i.to_f64().unwrap() % f),
            (Float(f), BigInt(i)) => Float(f % i.to_f64().unwrap()),
            (Float(x), Float(y)) => Float(x % y),
            (Dec(n), r) => Self::from_dec_str(&n) % r,
            (l, Dec(n)) => l % Self::from_dec_str(&n),
        }
    }
}

impl core::ops::Neg for Num {
    type Output = Self;
    fn neg(self) -> Self::Output {
        match self {
            Self::Int(x) => int_or_big(x.checked_neg(), [x], |[x]| -x),
            Self::BigInt(x) => Self::big_int(-&*x),
            Self::Float(x) => Self::Float(-x),
            Self::Dec(n) => match n.strip_prefix('-') {
                Some(pos) => Self::Dec(pos.to_string().into()),
                None => Self::Dec(alloc::format!("-{n}").into()),
            },
        }
    }
}

impl Hash for Num {
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self {
            // hash machine-sized integers like floating-point numbers,
            // because they are also compared for equality that way
            Self::Int(i) => Self::Float(*i as f64).hash(state),
            // hash all non-finite floats, like NaN and infinity, to the same
            // note that `Val::hash` assumes that `Num::hash` always starts
            // with `state.write_u8(n)`, where `n < 2`
            Self::Float(f) => {
                state.write_u8(0);
                if f.is_finite() {
                    f.to_ne_bytes().hash(state);
                }
            }
            Self::Dec(d) => Self::from_dec_str(d).hash(state),
            Self::BigInt(i) => {
                let f = i.to_f64().unwrap();
                if f.is_finite() {
                    Self::Float(f).hash(state)
                } else {
                    state.write_u8(1);
                    i.hash(state)
                }
            }
        }
    }
}

#[test]
fn hash_nums() {
    use core::f64::consts::PI;
    use core::hash::BuildHasher;
    let h = |n| foldhash::fast::FixedState::with_seed(42).hash_one(n);

    assert_eq!(h(Num::Int(4096)), h(Num::big_int(4096.into())));
    assert_eq!(h(Num::Float(0.0)), h(Num::Int(0)));
    assert_eq!(h(Num::Float(3.0)), h(Num::big_int(3.into())));

    assert_ne!(h(Num::Float(0.2)), h(Num::Float(0.4)));
    assert_ne!(h(Num::Float(PI)), h(Num::big_int(3.into())));
    assert_ne!(h(Num::Float(0.2)), h(Num::Int(1)));
    assert_ne!(h(Num::Int(1)), h(Num::Int(2)));
}

impl PartialEq for Num {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Int(x), Self::Int(y)) => x == y,
            (Self::Int(i), Self::Float(f)) | (Self::Float(f), Self::Int(i)) => {
                f.is_finite() && float_eq(*i as f64, *f)
            }
            (Self::BigInt(x), Self::BigInt(y)) => x == y,
            (Self::Int(i), Self::BigInt(b)) | (Self::BigInt(b), Self::Int(i)) => {
                **b == BigInt::from(*i)
            }
            (Self::BigInt(i), Self::Float(f)) | (Self::Float(f), Self::BigInt(i)) => {
                f.is_finite() && float_eq(i.to_f64().unwrap(), *f)
            }
            (Self::Float(x), Self::Float(y)) => float_eq(*x, *y),
            (Self::Dec(x), Self::Dec(y)) if Rc::ptr_eq(x, y) => true,
            // fanout: exactly with literals and integers (`exact_cmp`)
            (Self::Dec(n), y) => match exact_cmp(self, other) {
                Some(o) => o == Ordering::Equal,
                None => &Self::from_dec_str(n) == y,
            },
            (x, Self::Dec(n)) => match exact_cmp(self, other) {
                Some(o) => o == Ordering::Equal,
                None => x == &Self::from_dec_str(n),
            },
        }
    }
}

impl Eq for Num {}

impl PartialOrd for Num {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Num {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (Self::Int(x), Self::Int(y)) => x.cmp(y),
            (Self::Int(x), Self::BigInt(y)) => BigInt::from(*x).cmp(y),
            (Self::Int(i), Self::Float(f)) => float_cmp(*i as f64, *f),
            (Self::BigInt(x), Self::Int(y)) => (**x).cmp(&BigInt::from(*y)),
            (Self::BigInt(x), Self::BigInt(y)) => x.cmp(y),
            // BigInt::to_f64 always yields Some, large values become f64::INFINITY
            (Self::BigInt(x), Self::Float(y)) => float_cmp(x.to_f64().unwrap(), *y),
            (Self::Float(f), Self::Int(i)) => float_cmp(*f, *i as f64),
            (Self::Float(x), Self::BigInt(y)) => float_cmp(*x, y.to_f64().unwrap()),
            (Self::Float(x), Self::Float(y)) => float_cmp(*x, *y),
            (Self::Dec(x), Self::Dec(y)) if Rc::ptr_eq(x, y) => Ordering::Equal,
            // fanout: exactly with literals and integers (`exact_cmp`)
            (Self::Dec(n), y) => {
                exact_cmp(self, other).unwrap_or_else(|| Self::from_dec_str(n).cmp(y))
            }
            (x, Self::Dec(n)) => {
                exact_cmp(self, other).unwrap_or_else(|| x.cmp(&Self::from_dec_str(n)))
            }
        }
    }
}

/// fanout: a literal ([`Num::Dec`]) compares exactly (jq 1.7 compares literals exactly: two
/// ids above 2^53 that differ in the last digit are not equal) with the decimal the other
/// number is written as: an integer's digits, a finite float's shortest form (so a literal
/// compares with a float the way both print). `None` for other pairs (compared as floats).
fn exact_cmp(a: &Num, b: &Num) -> Option<Ordering> {
    use Num::{BigInt, Dec, Float, Int};
    let mut ba = [0u8; 24];
    let mut bb = [0u8; 24];
    let (mut ra, mut rb) = (ryu::Buffer::new(), ryu::Buffer::new());
    match (a, b) {
        (Dec(x), Dec(y)) => dec_cmp(x, y),
        (Dec(x), Int(i)) => dec_cmp(x, int_text(*i, &mut bb)),
        (Int(i), Dec(y)) => dec_cmp(int_text(*i, &mut ba), y),
        (Dec(x), BigInt(i)) => dec_cmp(x, &i.to_string()),
        (BigInt(i), Dec(y)) => dec_cmp(&i.to_string(), y),
        (Dec(x), Float(f)) if f.is_finite() => dec_cmp(x, rb.format_finite(*f)),
        (Float(f), Dec(y)) if f.is_finite() => dec_cmp(ra.format_finite(*f), y),
        _ => None,
    }
}

/// fanout: the decimal text of `i`, written into `buf`.
fn int_text(i: isize, buf: &mut [u8; 24]) -> &str {
    let mut n = i.unsigned_abs();
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if i < 0 {
        at -= 1;
        buf[at] = b'-';
    }
    core::str::from_utf8(&buf[at..]).unwrap_or("0")
}

fn float_eq(left: f64, right: f64) -> bool {
    float_cmp(left, right) == Ordering::Equal
}

fn float_cmp(left: f64, right: f64) -> Ordering {
    if left == 0. && right == 0. {
        // consider negative and positive 0 as equal
        Ordering::Equal
    } else if left.is_nan() {
        // there are more than 50 shades of NaN, and which of these
        // you strike when you perform a calculation is not deterministic (!),
        // therefore `total_cmp` may yield different results for the same calculation
        // so we bite the bullet and handle this like in jq
        Ordering::Less
    } else if right.is_nan() {
        Ordering::Greater
    } else {
        f64::total_cmp(&left, &right)
    }
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Self::Int(i) => write!(f, "{i}"),
            Self::BigInt(i) => write!(f, "{i}"),
            Self::Float(x) if x.is_nan() => write!(f, "NaN"),
            Self::Float(f64::INFINITY) => write!(f, "Infinity"),
            Self::Float(f64::NEG_INFINITY) => write!(f, "-Infinity"),
            Self::Float(x) => ryu::Buffer::new().format_finite(*x).fmt(f),
            Self::Dec(n) => write!(f, "{n}"),
        }
    }
}
