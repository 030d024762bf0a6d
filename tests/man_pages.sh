#!/bin/sh
# SPDX-License-Identifier: MIT
# The manual pages as a reader meets them: each renders with groff, every
# warning on, without one (and the commands' pages with man(1) as lintian
# reads them), each command's page has the sections people look for, and
# every public function of the header has a page by its name that
# `man FUNCTION` finds.
#   man_pages.sh MANDIR include/stash.h
set -eu
# Skipped (77), saying why, where the formatter is missing.
for tool in man groff; do
    command -v $tool >/dev/null || {
        echo "man_pages: skipped: no $tool (apt-get install man-db)"
        exit 77
    }
done
mandir=$1
header=$(realpath "$2")
cd "$mandir"
fail=0
say() {
    echo "man_pages: $*" >&2
    fail=1
}
render() {
    LC_ALL=C.UTF-8 MANROFFSEQ='' MANWIDTH=80 man --warnings -E UTF-8 -l -Tutf8 -Z "$1"
}
pages=0
for page in man1/*.1 man3/*.3; do
    [ -f "$page" ] || continue
    pages=$((pages + 1))
    # Every warning groff has (a .so link is read through the page it
    # names); man's own pass, slower, for the pages of the commands and
    # the header's.
    warnings=$(LC_ALL=C.UTF-8 groff -man -Tutf8 -ww -z "$page" 2>&1) || say "$page: groff failed"
    [ -z "$warnings" ] || say "$page: $warnings"
    case $page in
    man1/* | man3/stash.h.3)
        warnings=$(render "$page" 2>&1 >/dev/null) || say "$page: man failed"
        [ -z "$warnings" ] || say "$page: $warnings"
        ;;
    esac
    head -n 1 "$page" | grep -q '^\.so ' && continue
    grep -Eq '^\.TH "[^"]+" "[0-9]" "[0-9]{4}-[0-9]{2}-[0-9]{2}" "stash [0-9.]+"' "$page" ||
        say "$page: its .TH line has no release date or version"
    case $page in
    man1/*) sections="NAME SYNOPSIS DESCRIPTION OPTIONS EXIT_STATUS FILES EXAMPLES SEE_ALSO" ;;
    *) sections="NAME SYNOPSIS DESCRIPTION SEE_ALSO" ;;
    esac
    for s in $sections; do
        s=$(echo "$s" | tr _ ' ')
        grep -q "^\.SH $s\$" "$page" || say "$page: no section $s"
        # A section with something in it: its heading is not the last line
        # nor followed by another heading.
        sed -n "/^\.SH $s\$/{n;p;}" "$page" | grep -q '^\(\.SH\|\)$' &&
            say "$page: section $s is empty"
    done
done
[ "$pages" -gt 0 ] || say "no pages in $mandir"

# Every function the header exports, a page by its name whose NAME line
# names it: a page of its own, or a link (.so) to the page it shares.
functions=$(sed -n 's/^STASH_API [^(]*[ *]\([a-z_0-9]*\)(.*/\1/p' "$header")
[ -n "$functions" ] || say "no function found in $header"
name_line() { sed -n '/^\.SH NAME$/{n;p;q;}' "$1"; }
for f in $functions; do
    page=man3/$f.3
    [ -f "$page" ] || {
        say "no page for $f"
        continue
    }
    target=$(sed -n '1s/^\.so //p' "$page")
    [ -z "$target" ] || page=$target
    [ -f "$page" ] && name_line "$page" | grep -q "\\fB$f\\fR\|\(^\|[ ,]\)$f\([ ,]\|$\)" ||
        say "man3/$f.3 does not lead to a page named $f"
done
[ "$fail" -eq 0 ] || exit 1
echo "man_pages: $pages pages render without a warning; $(echo "$functions" | wc -l) functions" \
    "each have one"
