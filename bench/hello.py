"""The baseline of bench/pages.py: Flask's hello-world, served by the same gunicorn settings."""

from flask import Flask

app = Flask(__name__)


@app.get("/")
def hello() -> str:
    return "Hello, World!"
