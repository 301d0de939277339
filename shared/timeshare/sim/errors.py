"""Input errors that name the file, the line and the field."""


class InputError(ValueError):
    def __init__(self, file: str, line: int | None, field: str | None, message: str):
        where = file if line is None else f"{file}:{line}"
        what = f" {field}:" if field else ""
        super().__init__(f"{where}:{what} {message}")
        self.file, self.line, self.field, self.message = file, line, field, message
