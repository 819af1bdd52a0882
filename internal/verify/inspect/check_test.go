package inspect

import (
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func layoutWith(user string, files ...File) map[string]*Layout {
	m := Manifest{Platform: "linux/amd64", Config: ocispec.Image{Config: ocispec.ImageConfig{User: user}}, Layers: []Layer{{Files: files}}}
	return map[string]*Layout{"img": {Manifests: []Manifest{m}}}
}

func TestImageChecks(t *testing.T) {
	good := []File{{Path: "tmp", Mode: 0o1777, Type: '5'}, {Path: "usr/local/bin/x", Mode: 0o755, Type: '0'}}
	tests := []struct {
		name  string
		l     map[string]*Layout
		wants string // "" means the check passes
		root  string // the image's rootReason
		su    map[string]string
	}{
		{"good", layoutWith("65532:65532", good...), "", "", nil},
		{"root user", layoutWith("0:0", good...), "runs as root", "", nil},
		{"root user with a reason", layoutWith("0:0", good...), "", "manages host networking", nil},
		{"setuid with a root reason", layoutWith("0:0", File{Path: "usr/bin/su", Mode: 0o4755}), "setuid", "manages host networking", nil},
		{"no user", layoutWith("", good...), "runs as root", "", nil},
		{"setuid", layoutWith("65532", File{Path: "usr/bin/su", Mode: 0o4755}), "setuid", "", nil},
		{"setuid allowed", layoutWith("65532", File{Path: "bin/mount", Mode: 0o4755}), "", "", map[string]string{"/bin/mount": "mounts host paths"}},
		{"another setuid than allowed", layoutWith("65532", File{Path: "bin/mount", Mode: 0o4755}, File{Path: "bin/su", Mode: 0o4755}), "/bin/su is setuid", "", map[string]string{"/bin/mount": "mounts host paths"}},
		{"world-writable", layoutWith("65532", File{Path: "etc/passwd", Mode: 0o666}), "world-writable", "", nil},
		{"non-sticky tmp", layoutWith("65532", File{Path: "tmp", Mode: 0o777, Type: '5'}), "world-writable", "", nil},
		{"not root-owned", layoutWith("65532", File{Path: "etc/passwd", Mode: 0o644, UID: 65532}), "owned by 65532:0", "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Report{}
			ImageChecks(r, tt.l, map[string]Allowances{"img": {RootReason: tt.root, Setuid: tt.su}})
			c := r.Checks[0]
			if tt.wants == "" {
				if !c.OK {
					t.Errorf("failed: %s", c.Detail)
				}
				if tt.root != "" && !strings.Contains(c.Detail, tt.root) {
					t.Errorf("detail %q does not give the reason root is allowed", c.Detail)
				}
				for p, reason := range tt.su {
					if !strings.Contains(c.Detail, p+" setuid, allowed: "+reason) {
						t.Errorf("detail %q does not give the reason %s is allowed", c.Detail, p)
					}
				}
				return
			}
			if c.OK || !strings.Contains(c.Detail, tt.wants) {
				t.Errorf("got ok=%v %q, want a failure saying %q", c.OK, c.Detail, tt.wants)
			}
		})
	}
}
