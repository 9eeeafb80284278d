# One image for every Tide service; compose.yaml picks the module to run.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY libs ./libs
COPY services ./services
RUN pip install --no-cache-dir '.[agent]'
USER nobody
CMD ["tide", "--help"]
