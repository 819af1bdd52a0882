package plan

import (
	"net/url"
	"strings"
)

// ProxyEntry is one GOPROXY entry and the separator after it: "," falls
// back to the next entry only on 404 and 410, "|" on any error.
type ProxyEntry struct {
	URL string
	Sep string
}

// ProxyEntries splits a GOPROXY list the way the go command does.
func ProxyEntries(goproxy string) []ProxyEntry {
	var out []ProxyEntry
	rest := strings.TrimSpace(goproxy)
	for rest != "" {
		entry, sep := rest, ""
		if i := strings.IndexAny(rest, ",|"); i >= 0 {
			entry, sep, rest = rest[:i], rest[i:i+1], rest[i+1:]
		} else {
			rest = ""
		}
		out = append(out, ProxyEntry{URL: strings.TrimSpace(entry), Sep: sep})
	}
	return out
}

// RedactURL drops the credentials from a proxy URL before it is printed.
func RedactURL(proxy string) string {
	u, err := url.Parse(proxy)
	if err != nil {
		return "(unparsable GOPROXY entry)"
	}
	if u.User != nil {
		u.User = nil
	}
	return u.String()
}
