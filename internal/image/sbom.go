package image

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"time"

	spdxjson "github.com/spdx/tools-golang/json"
	"github.com/spdx/tools-golang/spdx"
	"github.com/spdx/tools-golang/spdx/v2/common"

	"github.com/kiln-build/kiln/internal/config"
)

// SPDXPredicateType is the in-toto predicate type of an SPDX document.
const SPDXPredicateType = "https://spdx.dev/Document"

// KilnVersion is the version of the kiln module in this binary (the
// magefile's), "devel" when built from a checkout or a replace.
func KilnVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	mods := append([]*debug.Module{&info.Main}, info.Deps...)
	for _, m := range mods {
		if m.Path != "github.com/kiln-build/kiln" {
			continue
		}
		if m.Replace != nil {
			m = m.Replace
		}
		if m.Version != "" && m.Version != "(devel)" {
			return m.Version
		}
	}
	return "devel"
}

// SBOM describes the binaries of one image for one platform as an SPDX 2.3
// document: each binary with its SHA-256, the Go standard library and every
// module its build info lists, the main module at the release version.
// created is the source date, so the document is reproducible; the
// namespace is unique per image, platform, version and binaries' content.
func SBOM(image, platform, version string, created time.Time, binaries map[string][]byte) ([]byte, error) {
	names := make([]string, 0, len(binaries))
	for n := range binaries {
		names = append(names, n)
	}
	sort.Strings(names)
	content := sha256.New()
	for _, name := range names {
		h := sha256.Sum256(binaries[name])
		fmt.Fprintf(content, "%s %x\n", name, h)
	}
	doc := &spdx.Document{
		SPDXVersion: spdx.Version, DataLicense: spdx.DataLicense, SPDXIdentifier: "DOCUMENT",
		DocumentName: fmt.Sprintf("%s %s %s", image, platform, version),
		DocumentNamespace: fmt.Sprintf("https://spdx.org/spdxdocs/kiln/%s/%s/%s/%s", image, strings.ReplaceAll(platform, "/", "-"), version,
			hex.EncodeToString(content.Sum(nil))[:16]),
		CreationInfo: &spdx.CreationInfo{
			Created:  created.UTC().Format(time.RFC3339),
			Creators: []common.Creator{{CreatorType: "Tool", Creator: "kiln-" + KilnVersion()}},
		},
	}
	seen := map[common.ElementID]bool{}
	add := func(p *spdx.Package) {
		if !seen[p.PackageSPDXIdentifier] {
			seen[p.PackageSPDXIdentifier] = true
			doc.Packages = append(doc.Packages, p)
		}
	}
	relate := func(a common.ElementID, rel string, b common.ElementID) {
		doc.Relationships = append(doc.Relationships, &spdx.Relationship{
			RefA: common.MakeDocElementID("", string(a)), RefB: common.MakeDocElementID("", string(b)), Relationship: rel})
	}
	purl := func(path, v string) []*spdx.PackageExternalReference {
		return []*spdx.PackageExternalReference{{Category: "PACKAGE-MANAGER", RefType: "purl", Locator: GoPURL(path, v)}}
	}
	for _, name := range names {
		info, err := buildinfo.Read(bytes.NewReader(binaries[name]))
		if err != nil {
			return nil, fmt.Errorf("SBOM of %s (%s): %s has no Go build info: %w", image, platform, name, err)
		}
		sum := sha256.Sum256(binaries[name])
		binID := common.ElementID("Binary-" + spdxID(name))
		add(&spdx.Package{PackageSPDXIdentifier: binID, PackageName: name, PackageVersion: version, PackageFileName: "/usr/local/bin/" + name,
			PackageDownloadLocation: "NOASSERTION", PrimaryPackagePurpose: "APPLICATION",
			PackageChecksums: []common.Checksum{{Algorithm: common.SHA256, Value: hex.EncodeToString(sum[:])}},
			PackageComment:   "built by " + info.GoVersion + " from " + info.Path})
		relate("DOCUMENT", "DESCRIBES", binID)
		std := common.ElementID("Package-stdlib-" + spdxID(info.GoVersion))
		add(&spdx.Package{PackageSPDXIdentifier: std, PackageName: "stdlib", PackageVersion: info.GoVersion,
			PackageDownloadLocation: "https://go.dev/dl/", PackageExternalReferences: purl("stdlib", info.GoVersion)})
		relate(binID, "DEPENDS_ON", std)
		// The main module is built from this checkout: its version is the
		// release's, never Go's "(devel)".
		mods := append([]debugModule{{info.Main.Path, version}}, depsOf(info)...)
		for _, m := range mods {
			id := common.ElementID("Package-" + spdxID(m.path+"@"+m.version))
			add(&spdx.Package{PackageSPDXIdentifier: id, PackageName: m.path, PackageVersion: m.version,
				PackageDownloadLocation: "NOASSERTION", PackageExternalReferences: purl(m.path, m.version)})
			relate(binID, "DEPENDS_ON", id)
		}
	}
	var out bytes.Buffer
	if err := spdxjson.Write(doc, &out, spdxjson.Indent("  ")); err != nil {
		return nil, fmt.Errorf("SBOM of %s (%s): %w", image, platform, err)
	}
	return out.Bytes(), nil
}

type debugModule struct{ path, version string }

func depsOf(info *buildinfo.BuildInfo) []debugModule {
	var out []debugModule
	for _, d := range info.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		out = append(out, debugModule{d.Path, d.Version})
	}
	return out
}

// spdxID keeps the characters SPDX ids allow.
func spdxID(s string) string {
	// Injective: "-" becomes "--" and any other character SPDX ids do not
	// allow becomes "-" and its hex code, so a/b and a-b stay apart.
	var b strings.Builder
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.':
			b.WriteRune(r)
		case r == '-':
			b.WriteString("--")
		default:
			fmt.Fprintf(&b, "-%x-", r)
		}
	}
	return b.String()
}

// Asset is one release file.
type Asset struct {
	Binary   string `json:"binary"`
	Platform string `json:"platform"`
	Name     string `json:"name"`
	SHA256   string `json:"sha256,omitempty"`
}

// Assets are the release files kiln.yaml's release.assets names: each
// binary for each platform listed under it, binaries in name order.
func Assets(r config.Release) []Asset {
	var out []Asset
	for _, bin := range slices.Sorted(maps.Keys(r.Assets)) {
		for _, platform := range r.Assets[bin] {
			out = append(out, Asset{Binary: bin, Platform: platform, Name: config.AssetName(bin, platform)})
		}
	}
	return out
}
