package config

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

var sizeRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*([KMG]i?B|B)?$`)

var sizeUnits = map[string]float64{
	"": 1, "B": 1,
	"KB": 1e3, "MB": 1e6, "GB": 1e9,
	"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30,
}

// ParseSize parses a byte size such as "4MiB", "3.5MB" or "4000000".
func ParseSize(s string) (int64, error) {
	m := sizeRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, fmt.Errorf("%q is not a size such as \"4MiB\", \"3.5MB\" or \"4000000\"", s)
	}
	n, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a size: %w", s, err)
	}
	v := n * sizeUnits[m[2]]
	if v < 1 || v > 1<<50 {
		return 0, fmt.Errorf("%q is out of range", s)
	}
	return int64(v), nil
}

// FormatSize renders bytes for people: 5.9MiB, 812.0KiB, 12B.
func FormatSize(n int64) string {
	neg := n < 0
	if neg {
		n = -n
	}
	out := ""
	switch {
	case n >= 1<<30:
		out = fmt.Sprintf("%.1fGiB", float64(n)/(1<<30))
	case n >= 1<<20:
		out = fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
	case n >= 1<<10:
		out = fmt.Sprintf("%.1fKiB", float64(n)/(1<<10))
	default:
		out = fmt.Sprintf("%dB", n)
	}
	if neg {
		return "-" + out
	}
	return out
}
