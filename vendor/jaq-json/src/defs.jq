# Conversion
def totype(p; e): if p then . else fromjson | if p then . else e end end;
# fanout: a string is a number only when all of it is one JSON number (surrounding whitespace
# allowed), as jq 1.7's `jv_parse` reads it: `"1abc"`, `"1 2"`, `"0x10"` are errors, not 1, 0.
# The error names the text (for the log), as `fromjson`'s own does.
def tonumber : if isstring then . as $s
    | [fromjson]
    | if length == 1 and (.[0] | isnumber) then .[0] else error("cannot parse \($s) as number") end
  else totype(isnumber ; error("cannot parse as number")) end;
def toboolean: totype(isboolean; error("cannot parse as boolean"));

# Arrays
def transpose: [range([.[] | length] | max) as $i | [.[][$i]]];

# Indexing
def in(xs)    : . as $x | xs | has     ($x);
def inside(xs): . as $x | xs | contains($x);
def  index($i): indices($i)[ 0];
def rindex($i): indices($i)[-1];

# Formatting
def @json: tojson;

