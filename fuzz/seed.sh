#!/bin/sh
# Refreshes the seed corpora in fuzz/seeds/ from the reference policies in
# ../policies, so seeds follow the policies as they change. Run from anywhere.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
policies="$here/../policies"
seeds="$here/seeds"

rm -rf "$seeds/policy" "$seeds/data"
mkdir -p "$seeds/policy" "$seeds/data" "$seeds/expression"

# policy: every reference policy, as is.
for policy in "$policies"/*.policy; do
    cp "$policy" "$seeds/policy/"
done

# data: for each policy's directory, catalog.yaml, a 0 byte, tenants.yaml
# (the input format of fuzz_targets/data.rs).
for dir in "$policies"/*/; do
    name=$(basename "$dir")
    if [ -f "$dir/catalog.yaml" ] && [ -f "$dir/tenants.yaml" ]; then
        { cat "$dir/catalog.yaml"; printf '\0'; cat "$dir/tenants.yaml"; } > "$seeds/data/$name"
    fi
done

# expression: a few hand-written expressions covering every construct
# (kept in the repository; only (re)written here when missing).
write_expr() {
    [ -f "$seeds/expression/$1" ] || printf '%s' "$2" > "$seeds/expression/$1"
}
write_expr durations '1.5s + 250ms - 5m * 2h / 1d'
write_expr percent '10% * route.price.input'
write_expr logic 'not a == b or c and d implies e'
write_expr compare 'a != b and c <= d and e >= f and g < h and i > j'
write_expr membership 'x not in [1, 2, 3] or "a\"b" in l'
write_expr call 'min(a, b, 3) + max(-a * b, 1)'
write_expr where 'min_of(cost where route.tier == "private")'
write_expr object '{ only: [it], allow_fallbacks: false, tag: null, on: true }'
write_expr if 'if present(route.price.input) then 3 * route.price.input + route.price.output else 0'
write_expr path 'input.provider.order'

echo "seeds: $(ls "$seeds/policy" | wc -l) policy, $(ls "$seeds/data" | wc -l) data, $(ls "$seeds/expression" | wc -l) expression"
