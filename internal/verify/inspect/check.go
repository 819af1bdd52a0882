package inspect

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/kiln-build/kiln/internal/config"
)

// Check is the outcome of one check on one subject.
type Check struct {
	Check   string `json:"check"`
	Subject string `json:"subject"`
	OK      bool   `json:"ok"`
	Detail  string `json:"detail"`
}

// Report is a list of checks.
type Report struct {
	Checks []Check `json:"checks"`
}

// Add appends a check.
func (r *Report) Add(c Check) { r.Checks = append(r.Checks, c) }

// Failed counts the checks that failed.
func (r *Report) Failed() int {
	n := 0
	for _, c := range r.Checks {
		if !c.OK {
			n++
		}
	}
	return n
}

// Err is nil when every check passed, and otherwise names the failures.
func (r *Report) Err() error {
	var failed []string
	for _, c := range r.Checks {
		if !c.OK {
			failed = append(failed, fmt.Sprintf("%s %s: %s", c.Check, c.Subject, c.Detail))
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d checks failed:\n  %s", len(failed), len(r.Checks), strings.Join(failed, "\n  "))
}

// WriteTable prints one row per check.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tSUBJECT\tRESULT\tDETAIL")
	for _, c := range r.Checks {
		result := "ok"
		if !c.OK {
			result = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.Check, c.Subject, result, c.Detail)
	}
	return tw.Flush()
}

// StaticChecks runs the static-link check on every binary of every image.
func StaticChecks(r *Report, layouts map[string]*Layout, binaries map[string][]string) {
	for _, name := range slices.Sorted(maps.Keys(layouts)) {
		l := layouts[name]
		for _, m := range l.Manifests {
			for _, b := range binaries[name] {
				subject := fmt.Sprintf("%s %s (%s image)", b, m.Platform, name)
				f, ok := m.File("usr/local/bin/" + b)
				if !ok {
					r.Add(Check{Check: "static", Subject: subject, Detail: fmt.Sprintf("%s has no /usr/local/bin/%s for %s; rebuild it with `mage images`", l.Path, b, m.Platform)})
					continue
				}
				res := Static(b, m.Platform, f.Data)
				detail := "no interpreter, no shared libraries, CGO_ENABLED=0, -trimpath"
				if !res.OK {
					detail = strings.Join(res.Problems, "; ")
				}
				r.Add(Check{Check: "static", Subject: subject, OK: res.OK, Detail: detail})
			}
		}
	}
}

// BudgetCheck checks one binary's size against its budget; entry carries the
// breakdown when there is one, to name what grew.
func BudgetCheck(binary, platform string, size, budget int64, entry *SizeEntry) Check {
	c := Check{Check: "budget", Subject: binary + " " + platform, OK: size <= budget}
	if c.OK {
		c.Detail = fmt.Sprintf("%s of %s (%d%%)", config.FormatSize(size), config.FormatSize(budget), size*100/budget)
		return c
	}
	c.Detail = fmt.Sprintf("%s exceeds the budget %s by %s", config.FormatSize(size), config.FormatSize(budget), config.FormatSize(size-budget))
	if entry == nil {
		return c
	}
	var names []string
	for _, g := range entry.Grown(3) {
		if g.Delta > 0 {
			names = append(names, fmt.Sprintf("%s +%s", g.Name, config.FormatSize(g.Delta)))
		} else {
			names = append(names, fmt.Sprintf("%s %s", g.Name, config.FormatSize(g.Bytes)))
		}
	}
	if len(names) > 0 {
		label := "largest"
		if entry.Grown(1)[0].Delta > 0 {
			label = "grew most"
		}
		c.Detail += fmt.Sprintf("; %s: %s", label, strings.Join(names, ", "))
	}
	// Modules first in the reader's mind: a heavy import is one module.
	var modules []string
	for _, m := range entry.GrownModules(3) {
		if m.Delta > 0 {
			modules = append(modules, fmt.Sprintf("%s +%s", m.Name, config.FormatSize(m.Delta)))
		}
	}
	if len(modules) > 0 {
		c.Detail += "; modules that grew: " + strings.Join(modules, ", ")
	}
	return c
}

// Allowances are what an image's image.yaml allows beyond the defaults:
// root, with RootReason, and setuid or setgid files, path (absolute) to
// reason.
type Allowances struct {
	RootReason string
	Setuid     map[string]string
}

// ImageChecks checks each image's config and files: a non-root user (root
// only with a reason), no setuid or setgid files but those allowed, nothing
// world-writable but a sticky /tmp, every file owned by root.
func ImageChecks(r *Report, layouts map[string]*Layout, allow map[string]Allowances) {
	for _, name := range slices.Sorted(maps.Keys(layouts)) {
		for _, m := range layouts[name].Manifests {
			subject := fmt.Sprintf("%s %s", name, m.Platform)
			var problems, setuid []string
			user := "non-root user " + m.Config.Config.User
			if u := m.Config.Config.User; u == "" || u == "0" || u == "root" || strings.HasPrefix(u, "0:") {
				if reason := allow[name].RootReason; reason != "" {
					user = fmt.Sprintf("root, allowed: %s", reason)
				} else {
					problems = append(problems, fmt.Sprintf("runs as root (user %q) with no rootReason in its image.yaml", u))
				}
			}
			for _, l := range m.Layers {
				for _, f := range l.Files {
					switch {
					case f.Mode&0o6000 != 0:
						if reason, ok := allow[name].Setuid["/"+f.Path]; ok {
							setuid = append(setuid, fmt.Sprintf("/%s setuid, allowed: %s", f.Path, reason))
						} else {
							problems = append(problems, fmt.Sprintf("/%s is setuid or setgid (mode %o); list it under setuid: in the image.yaml with a reason, or drop the bit", f.Path, f.Mode))
						}
					case f.Mode&0o002 != 0 && f.Type != '2' && !(f.Path == "tmp" && f.Mode&0o1000 != 0):
						problems = append(problems, fmt.Sprintf("/%s is world-writable (mode %o)", f.Path, f.Mode))
					}
					if f.UID != 0 || f.GID != 0 {
						problems = append(problems, fmt.Sprintf("/%s is owned by %d:%d, not root", f.Path, f.UID, f.GID))
					}
				}
			}
			detail := user + ", no setuid/setgid, nothing world-writable but /tmp, root-owned"
			if len(setuid) > 0 {
				detail = user + ", " + strings.Join(setuid, ", ") + ", nothing world-writable but /tmp, root-owned"
			}
			if len(problems) > 0 {
				detail = strings.Join(problems, "; ")
			}
			r.Add(Check{Check: "image", Subject: subject, OK: len(problems) == 0, Detail: detail})
		}
	}
}
