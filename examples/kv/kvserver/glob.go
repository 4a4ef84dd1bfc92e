package kvserver

// globMatch reports whether s matches the Redis glob pattern (KEYS, CONFIG
// GET): * is any run of bytes, ? any one byte, [abc] [^abc] [a-z] a set, and
// \x the byte x itself. Unlike path.Match, '/' is an ordinary byte and a bad
// pattern is not an error: an unclosed [ ends at the pattern's end, as in
// Redis.
//
// It backtracks only to the last *, so its time is O(len(pattern)*len(s))
// whatever the pattern: a KEYS "*a*a*a*a*b" cannot stall the server.
func globMatch(pattern, s string) bool {
	p, i := 0, 0
	star, starI := -1, 0 // the last * seen, and where in s its match ends
	for i < len(s) {
		if p < len(pattern) && pattern[p] == '*' {
			star, starI = p, i
			p++
			continue
		}
		if p < len(pattern) {
			if next, ok := matchOne(pattern, p, s[i]); ok {
				p, i = next, i+1
				continue
			}
		}
		if star < 0 {
			return false
		}
		// Let the last * take one more byte and try again from there.
		starI++
		p, i = star+1, starI
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// matchOne matches the pattern element at pattern[p] (not a *) against c and
// returns where the next element starts.
func matchOne(pattern string, p int, c byte) (next int, ok bool) {
	switch pattern[p] {
	case '?':
		return p + 1, true
	case '\\':
		if p+1 < len(pattern) {
			return p + 2, pattern[p+1] == c
		}
		return p + 1, c == '\\'
	case '[':
		p++
		negate := p < len(pattern) && pattern[p] == '^'
		if negate {
			p++
		}
		match := false
		for p < len(pattern) && pattern[p] != ']' {
			switch {
			case pattern[p] == '\\' && p+1 < len(pattern):
				match = match || pattern[p+1] == c
				p += 2
			case p+2 < len(pattern) && pattern[p+1] == '-':
				lo, hi := pattern[p], pattern[p+2]
				if lo > hi {
					lo, hi = hi, lo
				}
				match = match || lo <= c && c <= hi
				p += 3
			default:
				match = match || pattern[p] == c
				p++
			}
		}
		if p < len(pattern) {
			p++ // the ]
		}
		return p, match != negate
	}
	return p + 1, pattern[p] == c
}
