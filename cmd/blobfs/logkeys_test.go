package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Log keys are snake_case ASCII, so that a logfmt parser reads every line
// (a key with a space splits into two) and JSON keys look alike.
var logKey = regexp.MustCompile(`^[a-z0-9_]+$`)

// TestLogKeysInSource finds the slog keys written as string literals in
// the repository's Go files and refuses any that is not snake_case. It
// reads the syntax only (no type information), so it recognises a logger
// by the name it is called through (log, logger, Logger, slog, or a
// With(...) of one); TestLogFormats checks the lines that are really
// written, whatever the source looks like.
func TestLogKeysInSource(t *testing.T) {
	var files int
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || d.Name() == "vendor" || strings.HasPrefix(d.Name(), ".") && path != repoRoot) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		files++
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, bad := range badLogKeys(fset, f) {
			t.Errorf("%s: log key %s is not snake_case ASCII ([a-z0-9_]+)", bad.pos, bad.key)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("scanned %d Go files; the repository has more: is repoRoot right?", files)
	}
}

// TestLogKeysScanner: the scanner finds a bad key in each place a key is
// written, and passes good ones (a scanner that finds nothing would let
// TestLogKeysInSource pass on anything).
func TestLogKeysScanner(t *testing.T) {
	src := `package p
func f() {
	s.log.Info("msg", "good_key", 1, "bad key", 2)
	logger.With("nodeID", 1).Warn("msg", slog.Int("ok_1", 1), "Also bad", 3)
	slog.Default().Log(ctx, slog.LevelInfo, "msg", "fine", 1, "Bad", 2)
	opts.Logger.ErrorContext(ctx, "msg", slog.String("camelCase", "x"))
	log.Debug("msg", slog.Group("grp", "in group", 1))
	log.WithGroup("Group")
	a := []any{"spaced key", 1}
	_ = slog.Attr{Key: "Attr Key"}
	t.Error("not a logger", "Not A Key")
	strings.Contains("x", "Not A Key")
	log.Info("msg", attrs...)
	log.Info("msg", x, "after_attr", 1, "After Attr", 2)
}`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range badLogKeys(fset, f) {
		got = append(got, b.key)
	}
	want := []string{`"Also bad"`, `"After Attr"`, `"Attr Key"`, `"Bad"`, `"Group"`, `"bad key"`, `"camelCase"`, `"in group"`, `"nodeID"`, `"spaced key"`}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("scanner found %v; want %v", got, want)
	}
}

type badKey struct {
	pos token.Position
	key string
}

// logMethods maps the methods of *slog.Logger that take key-value pairs to
// the index of their first pair.
var logMethods = map[string]int{
	"Debug": 1, "Info": 1, "Warn": 1, "Error": 1,
	"DebugContext": 2, "InfoContext": 2, "WarnContext": 2, "ErrorContext": 2,
	"Log": 3, "LogAttrs": 3, "With": 0,
}

// attrFuncs are slog's Attr constructors: their first argument is a key.
var attrFuncs = map[string]bool{
	"String": true, "Int": true, "Int64": true, "Uint64": true, "Float64": true,
	"Bool": true, "Time": true, "Duration": true, "Any": true, "Group": true,
}

// loggerName matches what a logger is called through: s.log, logger,
// opts.Logger, slog.
var loggerName = regexp.MustCompile(`(^|\.)(log|logger|Logger|slog)$`)

// isLogger tells whether x looks like a *slog.Logger (or the slog package).
func isLogger(x ast.Expr) bool {
	switch x := x.(type) {
	case *ast.Ident:
		return loggerName.MatchString(x.Name)
	case *ast.SelectorExpr:
		return loggerName.MatchString(x.Sel.Name)
	case *ast.CallExpr:
		// logger.With(...).Info, slog.Default().Info
		if sel, ok := x.Fun.(*ast.SelectorExpr); ok {
			return (sel.Sel.Name == "With" || sel.Sel.Name == "WithGroup") && isLogger(sel.X) ||
				sel.Sel.Name == "Default" && isIdent(sel.X, "slog")
		}
	}
	return false
}

func isIdent(x ast.Expr, name string) bool {
	id, ok := x.(*ast.Ident)
	return ok && id.Name == name
}

// badLogKeys returns the string-literal log keys in f that are not
// snake_case: in the key-value arguments of logger methods, in slog's Attr
// constructors and slog.Attr literals, in WithGroup, and in []any literals
// (lists of attributes built ahead of the call).
func badLogKeys(fset *token.FileSet, f *ast.File) []badKey {
	var bad []badKey
	check := func(lit *ast.BasicLit) {
		s, err := strconv.Unquote(lit.Value)
		if err != nil || !logKey.MatchString(s) {
			bad = append(bad, badKey{fset.Position(lit.Pos()), lit.Value})
		}
	}
	// pairs checks args as slog reads them: an Attr stands alone, a
	// string is a key followed by its value.
	pairs := func(args []ast.Expr) {
		for i := 0; i < len(args); i++ {
			switch a := args[i].(type) {
			case *ast.BasicLit:
				if a.Kind == token.STRING {
					check(a)
					i++ // its value
				}
			case *ast.CallExpr:
				// slog.String(...) and friends: one Attr, checked
				// where the walk reaches it.
			default:
				// A variable: an Attr or a key held elsewhere;
				// either way one argument, as far as can be seen.
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			name := sel.Sel.Name
			if isIdent(sel.X, "slog") && attrFuncs[name] && len(n.Args) > 0 {
				if lit, ok := n.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					check(lit)
				}
				if name == "Group" {
					pairs(n.Args[1:])
				}
				return true
			}
			if !isLogger(sel.X) {
				return true
			}
			if name == "WithGroup" && len(n.Args) == 1 {
				if lit, ok := n.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					check(lit)
				}
				return true
			}
			if first, ok := logMethods[name]; ok && len(n.Args) > first && !n.Ellipsis.IsValid() {
				pairs(n.Args[first:])
			}
		case *ast.CompositeLit:
			switch typ := n.Type.(type) {
			case *ast.ArrayType:
				if el, ok := typ.Elt.(*ast.Ident); ok && (el.Name == "any" || el.Name == "interface{}") {
					pairs(n.Elts)
				}
			case *ast.SelectorExpr:
				if isIdent(typ.X, "slog") && typ.Sel.Name == "Attr" {
					for _, e := range n.Elts {
						if kv, ok := e.(*ast.KeyValueExpr); ok && isIdent(kv.Key, "Key") {
							if lit, ok := kv.Value.(*ast.BasicLit); ok && lit.Kind == token.STRING {
								check(lit)
							}
						}
					}
				}
			}
		}
		return true
	})
	return bad
}
