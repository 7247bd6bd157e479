import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A small JSON parser and writer, hand-written for the baseline (no libraries). Values are
 * {@code LinkedHashMap<String, Object>} (key order kept, like serde_json's preserve_order),
 * {@code ArrayList<Object>}, {@code String}, {@link Num} (the number's text as it arrived, written
 * back unchanged), {@code Boolean} and {@link #NULL}. Output is compact, escaped like serde_json.
 */
final class Json {
    private Json() {}

    /** JSON null (Java's null means "absent"). */
    static final Object NULL = new Object() {
        @Override
        public String toString() {
            return "null";
        }
    };

    /** A number, kept as its JSON text. */
    static final class Num {
        final String text;

        Num(String text) {
            this.text = text;
        }

        @Override
        public boolean equals(Object o) {
            return o instanceof Num && ((Num) o).text.equals(text);
        }

        @Override
        public int hashCode() {
            return text.hashCode();
        }

        @Override
        public String toString() {
            return text;
        }
    }

    /** Invalid JSON, with the position of the problem. */
    static final class ParseError extends Exception {
        ParseError(String message) {
            super(message);
        }
    }

    private static final int MAX_DEPTH = 128;

    static Object parse(byte[] bytes) throws ParseError {
        return new Parser(new String(bytes, StandardCharsets.UTF_8)).document();
    }

    static Object parse(String text) throws ParseError {
        return new Parser(text).document();
    }

    /** {@code value[key]} when value is an object, else null (absent). */
    static Object get(Object value, String key) {
        if (value instanceof Map) {
            return ((Map<?, ?>) value).get(key);
        }
        return null;
    }

    private static final class Parser {
        private final String s;
        private int i;
        private int depth;

        Parser(String s) {
            this.s = s;
        }

        Object document() throws ParseError {
            ws();
            Object v = value();
            ws();
            if (i < s.length()) {
                throw error("trailing characters");
            }
            return v;
        }

        private ParseError error(String what) {
            int line = 1;
            int col = 1;
            for (int k = 0; k < Math.min(i, s.length()); k++) {
                if (s.charAt(k) == '\n') {
                    line++;
                    col = 1;
                } else {
                    col++;
                }
            }
            return new ParseError(what + " at line " + line + " column " + col);
        }

        private void ws() {
            while (i < s.length()) {
                char c = s.charAt(i);
                if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
                    i++;
                } else {
                    break;
                }
            }
        }

        private Object value() throws ParseError {
            if (i >= s.length()) {
                throw error("EOF while parsing a value");
            }
            char c = s.charAt(i);
            switch (c) {
                case '{':
                    return object();
                case '[':
                    return array();
                case '"':
                    return string();
                case 't':
                    return literal("true", Boolean.TRUE);
                case 'f':
                    return literal("false", Boolean.FALSE);
                case 'n':
                    return literal("null", NULL);
                default:
                    if (c == '-' || (c >= '0' && c <= '9')) {
                        return number();
                    }
                    throw error("expected value");
            }
        }

        private Object literal(String word, Object v) throws ParseError {
            if (!s.startsWith(word, i)) {
                throw error("expected " + word);
            }
            i += word.length();
            return v;
        }

        private void enter() throws ParseError {
            if (++depth > MAX_DEPTH) {
                throw error("recursion limit exceeded");
            }
        }

        private Object object() throws ParseError {
            enter();
            i++; // {
            Map<String, Object> m = new LinkedHashMap<>();
            ws();
            if (i < s.length() && s.charAt(i) == '}') {
                i++;
                depth--;
                return m;
            }
            while (true) {
                ws();
                if (i >= s.length() || s.charAt(i) != '"') {
                    throw error("key must be a string");
                }
                String k = string();
                ws();
                if (i >= s.length() || s.charAt(i) != ':') {
                    throw error("expected `:`");
                }
                i++;
                ws();
                m.put(k, value());
                ws();
                if (i >= s.length()) {
                    throw error("EOF while parsing an object");
                }
                char c = s.charAt(i++);
                if (c == '}') {
                    depth--;
                    return m;
                }
                if (c != ',') {
                    i--;
                    throw error("expected `,` or `}`");
                }
            }
        }

        private Object array() throws ParseError {
            enter();
            i++; // [
            List<Object> a = new ArrayList<>();
            ws();
            if (i < s.length() && s.charAt(i) == ']') {
                i++;
                depth--;
                return a;
            }
            while (true) {
                ws();
                a.add(value());
                ws();
                if (i >= s.length()) {
                    throw error("EOF while parsing a list");
                }
                char c = s.charAt(i++);
                if (c == ']') {
                    depth--;
                    return a;
                }
                if (c != ',') {
                    i--;
                    throw error("expected `,` or `]`");
                }
            }
        }

        private String string() throws ParseError {
            i++; // opening quote
            StringBuilder b = new StringBuilder();
            while (true) {
                if (i >= s.length()) {
                    throw error("EOF while parsing a string");
                }
                char c = s.charAt(i++);
                if (c == '"') {
                    return b.toString();
                }
                if (c < 0x20) {
                    i--;
                    throw error("control character in string");
                }
                if (c != '\\') {
                    b.append(c);
                    continue;
                }
                if (i >= s.length()) {
                    throw error("EOF while parsing a string");
                }
                char e = s.charAt(i++);
                switch (e) {
                    case '"':
                        b.append('"');
                        break;
                    case '\\':
                        b.append('\\');
                        break;
                    case '/':
                        b.append('/');
                        break;
                    case 'b':
                        b.append('\b');
                        break;
                    case 'f':
                        b.append('\f');
                        break;
                    case 'n':
                        b.append('\n');
                        break;
                    case 'r':
                        b.append('\r');
                        break;
                    case 't':
                        b.append('\t');
                        break;
                    case 'u':
                        b.append(hex4());
                        break;
                    default:
                        i--;
                        throw error("invalid escape");
                }
            }
        }

        private char hex4() throws ParseError {
            if (i + 4 > s.length()) {
                throw error("EOF while parsing a string");
            }
            int v = 0;
            for (int k = 0; k < 4; k++) {
                int d = Character.digit(s.charAt(i++), 16);
                if (d < 0) {
                    throw error("invalid \\u escape");
                }
                v = v * 16 + d;
            }
            return (char) v;
        }

        private Object number() throws ParseError {
            int start = i;
            if (s.charAt(i) == '-') {
                i++;
            }
            if (i >= s.length()) {
                throw error("invalid number");
            }
            if (s.charAt(i) == '0') {
                i++;
            } else if (digit()) {
                while (digit()) {
                    i++;
                }
            } else {
                throw error("invalid number");
            }
            if (i < s.length() && s.charAt(i) == '.') {
                i++;
                if (!digit()) {
                    throw error("invalid number");
                }
                while (digit()) {
                    i++;
                }
            }
            if (i < s.length() && (s.charAt(i) == 'e' || s.charAt(i) == 'E')) {
                i++;
                if (i < s.length() && (s.charAt(i) == '+' || s.charAt(i) == '-')) {
                    i++;
                }
                if (!digit()) {
                    throw error("invalid number");
                }
                while (digit()) {
                    i++;
                }
            }
            return new Num(s.substring(start, i));
        }

        private boolean digit() {
            return i < s.length() && s.charAt(i) >= '0' && s.charAt(i) <= '9';
        }
    }

    /** Compact JSON text of a value. */
    static String write(Object v) {
        StringBuilder b = new StringBuilder(256);
        write(v, b);
        return b.toString();
    }

    static void write(Object v, StringBuilder b) {
        if (v == null || v == NULL) {
            b.append("null");
        } else if (v instanceof String) {
            string((String) v, b);
        } else if (v instanceof Num || v instanceof Boolean) {
            b.append(v);
        } else if (v instanceof Map) {
            b.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                if (!first) {
                    b.append(',');
                }
                first = false;
                string(String.valueOf(e.getKey()), b);
                b.append(':');
                write(e.getValue(), b);
            }
            b.append('}');
        } else if (v instanceof List) {
            b.append('[');
            boolean first = true;
            for (Object x : (List<?>) v) {
                if (!first) {
                    b.append(',');
                }
                first = false;
                write(x, b);
            }
            b.append(']');
        } else if (v instanceof Number) {
            b.append(v);
        } else {
            string(v.toString(), b);
        }
    }

    private static final char[] HEX = "0123456789abcdef".toCharArray();

    private static void string(String s, StringBuilder b) {
        b.append('"');
        for (int k = 0; k < s.length(); k++) {
            char c = s.charAt(k);
            switch (c) {
                case '"':
                    b.append("\\\"");
                    break;
                case '\\':
                    b.append("\\\\");
                    break;
                case '\n':
                    b.append("\\n");
                    break;
                case '\r':
                    b.append("\\r");
                    break;
                case '\t':
                    b.append("\\t");
                    break;
                case '\b':
                    b.append("\\b");
                    break;
                case '\f':
                    b.append("\\f");
                    break;
                default:
                    if (c < 0x20) {
                        b.append("\\u00").append(HEX[c >> 4]).append(HEX[c & 0xf]);
                    } else {
                        b.append(c);
                    }
            }
        }
        b.append('"');
    }

    /** How jq's string interpolation renders a value: strings as they are, else compact JSON. */
    static String interpolate(Object v) {
        return v instanceof String ? (String) v : write(v);
    }

    /** How jq's {@code join(",")} renders a list: strings as they are, null as nothing. */
    static String join(List<?> items) {
        StringBuilder b = new StringBuilder();
        for (int k = 0; k < items.size(); k++) {
            if (k > 0) {
                b.append(',');
            }
            Object v = items.get(k);
            if (v != null && v != NULL) {
                b.append(interpolate(v));
            }
        }
        return b.toString();
    }
}
