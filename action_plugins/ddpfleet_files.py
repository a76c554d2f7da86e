"""ddpfleet_files: settle many files and directories on a host with one module run when they
are already right, instead of two per file (ansible.builtin.copy and template each run a
remote stat, then the file module for the attributes, even when nothing changes: a no-op
site.yml spent about a third of its time there).

Each entry of ``files`` has ``dest`` and one of ``src`` (a file of the role, as copy's src),
``template`` (a template of the role, as template's src), ``content`` (a string), or none (a
directory), and for a file ``validate`` (as copy's); ``owner``, ``group`` and ``mode`` default
to the task's (root, root, 0644 for a file, 0755 for a directory). The content is rendered or
read here, on the controller, and its SHA-1 sent with the others to the node module of the
same name (library/ddpfleet_files.py), which creates directories and sets owner, group and
mode, and reports each file whose content differs. Those alone are written by the real
ansible.builtin.copy or template action, with their check mode, diff and validation: a
rendering that differed from template's would cost time, never a wrong file. The result is
changed when anything was.
"""

from __future__ import annotations

import os

from ansible._internal._templating import _template_vars
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.template import trust_as_template
from ansible.utils.hashing import checksum, checksum_s

ENTRY = {
    "dest": {"type": "str", "required": True},
    "src": {"type": "str"},
    "template": {"type": "str"},
    "content": {"type": "str", "no_log": False},
    "owner": {"type": "str"},
    "group": {"type": "str"},
    "mode": {"type": "str"},
    "validate": {"type": "str"},
}
SPEC = {
    "files": {"type": "list", "elements": "dict", "options": ENTRY, "required": True},
    "owner": {"type": "str", "default": "root"},
    "group": {"type": "str", "default": "root"},
    "mode": {"type": "str"},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = True
    _supports_check_mode = True

    def run(self, tmp: object = None, task_vars: dict | None = None) -> dict:
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=SPEC)
        try:
            entries = [self._entry(e, args, task_vars) for e in args["files"]]
        except AnsibleActionFail as exc:
            return {**result, "failed": True, "msg": str(exc)}
        node = self._execute_module(
            module_name="ddpfleet_files",
            module_args={"files": [{k: v for k, v in e.items() if k != "write"} for e in entries]},
            task_vars=task_vars,
        )
        if node.get("failed"):
            return {**result, **node}
        changed, diffs = bool(node.get("changed")), list(node.get("diff") or [])
        for entry, done in zip(entries, node["results"], strict=True):
            if done["status"] != "content":
                continue
            written = self._write(entry, task_vars)
            if written.get("failed"):
                return {**result, **written, "msg": f"{entry['dest']}: {written.get('msg', '')}"}
            changed = changed or bool(written.get("changed"))
            diff = written.get("diff")
            diffs.extend(diff if isinstance(diff, list) else [diff] if diff else [])
        self._remove_tmp_path(self._connection._shell.tmpdir)
        out = {**result, "changed": changed, "results": node["results"]}
        if self._task.diff and diffs:
            out["diff"] = diffs
        return out

    def _entry(self, e: dict, args: dict, task_vars: dict) -> dict:
        sources = [k for k in ("src", "template", "content") if e.get(k) is not None]
        if len(sources) > 1:
            raise AnsibleActionFail(f"{e['dest']}: give one of src, template or content")
        kind = "file" if sources else "directory"
        mode = e.get("mode") or args["mode"] or ("0644" if kind == "file" else "0755")
        entry = {"dest": e["dest"], "state": kind, "owner": e.get("owner") or args["owner"],
                 "group": e.get("group") or args["group"], "mode": mode}  # fmt: skip
        if kind == "directory":
            return entry
        how = sources[0]
        if how == "content":
            entry["checksum"] = checksum_s(e["content"])
        elif how == "src":
            entry["checksum"] = checksum(self._find_needle("files", e["src"]))
        else:
            entry["checksum"] = checksum_s(self._render(e["template"], e["dest"], task_vars))
        write = {"src" if how == "template" else how: e[how]}
        if e.get("validate"):
            write["validate"] = e["validate"]
        entry["write"] = {"action": "template" if how == "template" else "copy", "args": write}
        return entry

    def _render(self, name: str, dest: str, task_vars: dict) -> str:
        """The template as ansible.builtin.template renders it by default (trim_blocks, the
        role's templates/ on the search path, its template variables)."""
        source = self._find_needle("templates", name)
        paths = [*task_vars.get("ansible_search_path", []), self._loader._basedir]
        paths.append(os.path.dirname(source))
        searchpath = [q for p in paths for q in (os.path.join(p, "templates"), p)]
        variables = {**task_vars, **_template_vars.generate_ansible_template_vars(
            path=name, fullpath=source, dest_path=dest,
            include_ansible_managed="ansible_managed" not in task_vars)}  # fmt: skip
        templar = self._templar.copy_with_new_env(
            searchpath=searchpath, available_variables=variables
        )
        data = trust_as_template(self._loader.get_text_file_contents(source))
        rendered = templar.template(data, escape_backslashes=False, overrides={"trim_blocks": True})
        return rendered or ""

    def _write(self, entry: dict, task_vars: dict) -> dict:
        task = self._task.copy()
        task.args = {**entry["write"]["args"], "dest": entry["dest"], "owner": entry["owner"],
                     "group": entry["group"], "mode": entry["mode"]}  # fmt: skip
        action = self._shared_loader_obj.action_loader.get(
            f"ansible.legacy.{entry['write']['action']}",
            task=task,
            connection=self._connection,
            play_context=self._play_context,
            loader=self._loader,
            templar=self._templar,
            shared_loader_obj=self._shared_loader_obj,
        )
        return action.run(task_vars=task_vars)
