package config

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Finding is one way the configured build would split the Go build cache or
// relink needlessly, with what it costs and how to fix it.
type Finding struct {
	Kind     string   `json:"kind"`
	Field    string   `json:"field"`
	Binaries []string `json:"binaries"`
	Problem  string   `json:"problem"`
	Cost     string   `json:"cost"`
	Fix      string   `json:"fix"`
	// Warning findings cost nothing at build time but are likely mistakes.
	Warning bool `json:"warning,omitempty"`
}

func (f Finding) String() string {
	return fmt.Sprintf("%s: %s: %s", File, f.Field, f.Problem)
}

// Drift finds every difference between the binaries' Go environments and
// every linker flag whose value changes from build to build.
func (c *Config) Drift() []Finding {
	var out []Finding
	shared := c.Effective(Binary{})
	for i, b := range c.Binaries {
		if b.Go == nil {
			continue
		}
		eff := c.Effective(b)
		field := fmt.Sprintf("binaries[%d].go", i)
		add := func(kind, sub, problem, cost, fix string) {
			out = append(out, Finding{Kind: kind, Field: field + sub, Binaries: []string{b.Name}, Problem: problem, Cost: cost, Fix: fix})
		}
		if v, ok := b.Go.Env["CGO_ENABLED"]; ok && v != "0" {
			add("cgo", ".env.CGO_ENABLED",
				fmt.Sprintf("%s builds with CGO_ENABLED=%s, every other binary with 0", b.Name, v),
				"every package with cgo-dependent files (runtime/cgo, net, os/user and all that import them) compiles a second time, and the binary links against the host's libc (\"GLIBC_2.34 not found\" on older nodes); Antrea measured 30% of its image build time lost to this split",
				"remove CGO_ENABLED from "+field+".env")
		}
		if !slices.Equal(eff.Tags, shared.Tags) {
			add("tags", ".tags",
				fmt.Sprintf("%s builds with tags %v, the others with %v", b.Name, eff.Tags, shared.Tags),
				"the packages of "+b.Name+" are compiled again under other tags and share no compile results with the other binaries",
				"move the tags to go.tags (all binaries) or drop them from "+field)
		}
		if eff.GCFlags != shared.GCFlags {
			add("gcflags", ".gcflags",
				fmt.Sprintf("%s builds with gcflags %q, the others with %q", b.Name, eff.GCFlags, shared.GCFlags),
				"every package the flags apply to compiles twice, once per value",
				"use one go.gcflags for every binary")
		}
		if !slices.Equal(eff.Flags, shared.Flags) {
			kind, cost := "flags", "every package of "+b.Name+" compiles again with the other flags"
			if slices.ContainsFunc(eff.Flags, func(f string) bool { return strings.HasPrefix(f, "-trimpath") }) {
				kind, cost = "trimpath", "-trimpath changes every compile's cache key, so the whole dependency graph of "+b.Name+" compiles twice, and host paths end up in the binary (not reproducible)"
			}
			add(kind, ".flags",
				fmt.Sprintf("%s builds with flags %v, the others with %v", b.Name, eff.Flags, shared.Flags),
				cost, "use one go.flags for every binary")
		}
		for _, k := range sortedKeys(eff.Env) {
			if k == "CGO_ENABLED" || eff.Env[k] == shared.Env[k] {
				continue
			}
			kind, cost := "goenv", fmt.Sprintf("every package of %s compiles again for the platforms %s applies to, sharing nothing with the other binaries", b.Name, k)
			if k == "GOFLAGS" {
				kind, cost = "goflags", "the flags in GOFLAGS change the compile cache keys of every package of "+b.Name
			}
			add(kind, ".env."+k,
				fmt.Sprintf("%s builds with %s=%q, the others with %q", b.Name, k, eff.Env[k], shared.Env[k]),
				cost, fmt.Sprintf("set %s in go.env for every binary, or not at all", k))
		}
	}
	check := func(field, ldflags string, bins []string) {
		for _, v := range volatileStamps(ldflags) {
			out = append(out, Finding{Kind: "volatile-ldflags", Field: field, Binaries: bins,
				Problem: fmt.Sprintf("-X %s changes from build to build", v),
				Cost:    "every binary relinks on every build (or commit) even when no code changed, and the output digests change with it",
				Fix:     "drop it; versions, commits and tree state come from stamp.package and are stamped only with -stamp (release builds)"})
		}
	}
	var all []string
	for _, b := range c.Binaries {
		all = append(all, b.Name)
	}
	check("go.ldflags", c.Go.LDFlags, all)
	for i, b := range c.Binaries {
		if b.Go != nil {
			check(fmt.Sprintf("binaries[%d].go.ldflags", i), b.Go.LDFlags, []string{b.Name})
		}
	}
	return out
}

var (
	xFlagRE      = regexp.MustCompile(`-X[= ]?\s*([^\s=]+)=(\S*)`)
	volatileRE   = regexp.MustCompile(`\$\(|` + "`" + `|\{\{|^[0-9a-f]{7,40}$|[0-9]{4}-[0-9]{2}-[0-9]{2}|^[0-9]{10}$`)
	volatileName = regexp.MustCompile(`(?i)(date|time|stamp|commit|revision|sha)`)
)

// volatileStamps returns the -X assignments whose value would differ from one
// build to the next: shell substitutions, templates, commit ids, timestamps.
func volatileStamps(ldflags string) []string {
	var out []string
	for _, m := range xFlagRE.FindAllStringSubmatch(ldflags, -1) {
		name, value := m[1], strings.Trim(m[2], `'"`)
		if volatileRE.MatchString(value) || (value == "" && volatileName.MatchString(name)) {
			out = append(out, name+"="+value)
		}
	}
	return out
}
